"""The adapter contract against the frameworkcontroller adapter: each trial a ``Framework`` on the
Kubernetes emulator (``tests/emulators/kubernetes``), through the official client over real HTTP.

The emulator runs each task's pod as local processes; the NFS volume is a folder here that the
adapter writes to (``share_mounts``) and the "pods" reach at ``containerMountPath`` (a link the
emulator makes). A Framework runs its task roles' commands, not the request's ``trialCommand``
(NNI's rule), so each request carries the contract's command as its one role's command. The
experiment is on the bus, where a restarted adapter finds its namespace again.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from contracts import ExperimentConfig, ExperimentState, TrialRequest, TrialStatus, streams
from contracts.base import utcnow
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.adapters.base import TrialHandle
from services.adapters.frameworkcontroller import FrameworkcontrollerAdapter, FrameworkcontrollerSettings
from services.common.bus import Bus
from tests.contract.adapter_contract import AdapterContract, Harness, outcome_at_a_notify
from tests.emulators.kubernetes import Kubernetes, start_kubernetes

EXPERIMENT = "contract"
NFS = "nfs://nfs.test/export"


class TestFrameworkcontrollerAdapter(AdapterContract):
    capacity = 2
    #: A stopped Framework's end reaches the adapter through its watch.
    cancel_within = 3.0

    @pytest.fixture
    def k8s(self, workspace: Path) -> Iterator[Kubernetes]:
        (workspace / "share").mkdir()
        emulator = start_kubernetes(workspace / "k8s", token="t0ken", volumes={NFS: str(workspace / "share")})
        yield emulator
        emulator.stop()

    @pytest.fixture(autouse=True)
    async def cluster(self, k8s: Kubernetes, workspace: Path, bus: Bus) -> AsyncIterator[None]:
        """The emulator's namespace ``default`` with the NFS storage, and the experiment on the bus."""
        self.kubeconfig = k8s.kubeconfig(workspace / "kubeconfig")
        self.service = role_command(
            FrameworkcontrollerConfig.model_validate(
                {
                    "platform": "frameworkcontroller",
                    "namespace": "default",
                    "storage": {"storageType": "nfs", "server": "nfs.test", "path": "/export"},
                    "containerMountPath": f"/tmp/tb-fc-{secrets.token_hex(4)}",
                    "taskRoles": [
                        {
                            "name": "worker",
                            "taskNumber": 1,
                            "command": "true",
                            "cpuNumber": 1,
                            "memorySize": "512mb",
                            "dockerImage": "python:3.11",
                        }
                    ],
                }
            ),
            "true",
        )
        config = ExperimentConfig.model_validate(
            {"trialCommand": "true", "trialConcurrency": self.capacity, "trainingService": self.service}
        )
        experiments = await bus.kv(streams.EXPERIMENTS_BUCKET.bucket)
        await experiments.put(EXPERIMENT, ExperimentState(id=EXPERIMENT, config=config, start_time=utcnow()).encode())
        yield

    def make_adapter(self, workspace: Path) -> FrameworkcontrollerAdapter:
        settings = FrameworkcontrollerSettings(
            replica="contract",
            kubeconfig=self.kubeconfig,
            share_mounts={NFS: workspace / "share"},
            watch_timeout=5,
            status_interval=0.5,
            gateway_url="http://127.0.0.1:9",  # no gateway: trials here report no metrics
        )
        return FrameworkcontrollerAdapter(settings)

    def starts(self, workspace: Path, trial_id: str) -> int:
        marker = workspace / "starts" / trial_id
        return len(marker.read_text().splitlines()) if marker.exists() else 0

    def request(self, workspace: Path, duration: float = 0.0, exit_code: int = 0, attempt: int = 0) -> TrialRequest:
        request = super().request(workspace, duration, exit_code, attempt)
        return request.model_copy(update={"training_service": role_command(self.service, request.trial_command)})

    # ------------------------------------------------------------------ where the platform differs

    async def test_the_adapter_says_when_a_trial_ended(self, platform: Harness) -> None:
        """The frameworkcontroller adapter calls ``notify`` at every event its watch brings about
        the trial's Framework (created, pods running, completed), not only at the end. So: the
        trial is named, and at one of its namings (not ``poll_interval`` later) ``poll`` says how
        it ended."""
        adapter = await platform.adapter()
        named: list[TrialHandle | None] = []
        adapter.listen(named.append)

        handle = await adapter.launch(platform.request(duration=0.2))

        outcome = await outcome_at_a_notify(adapter, handle, named, 0.2 + self.slack)
        assert outcome.status is TrialStatus.SUCCEEDED, outcome

    async def test_no_capacity_is_none_until_a_trial_ends(self, platform: Harness) -> None:
        """A Framework the cluster has no room for waits for its pods (``AttemptCreationPending``
        … ``AttemptPreparing``; the trial's message says so after ``queue_note_after``): the
        adapter hands every trial to Kubernetes and never answers None. So: more trials than
        :attr:`capacity` are all taken, each its own Framework, and all of them start."""
        adapter = await platform.adapter()
        running = [await adapter.launch(platform.request(duration=60)) for _ in range(self.capacity + 1)]

        assert all(running) and len(set(running)) == len(running)
        for handle in running:
            await platform.until_started(handle)
            assert await adapter.poll(handle) is None


def role_command(service: FrameworkcontrollerConfig, command: str) -> FrameworkcontrollerConfig:
    """``service`` whose one task role runs ``command``."""
    [role] = service.task_roles
    return service.model_copy(update={"task_roles": [role.model_copy(update={"command": command})]})
