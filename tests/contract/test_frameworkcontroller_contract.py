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

from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.adapters.frameworkcontroller import FrameworkcontrollerAdapter, FrameworkcontrollerSettings
from services.common.bus import Bus
from tests.contract.adapter_contract import NO_GATEWAY, AdapterContract
from tests.emulators.kubernetes import Kubernetes, start_kubernetes

NFS = "nfs://nfs.test/export"


class TestFrameworkcontrollerAdapter(AdapterContract):
    capacity = 2
    #: A stopped Framework's end reaches the adapter through its watch.
    cancel_within = 3.0
    #: The adapter calls ``notify`` at every event its watch brings about the trial's Framework
    #: (created, pods running, completed), not only at the end.
    notifies_while_running = True
    #: A Framework its namespace has no room for waits for its pods (``AttemptCreationPending``
    #: … ``AttemptPreparing``; the trial's message says so after ``queue_note_after``).
    queues = True

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
        self.service = FrameworkcontrollerConfig.model_validate(
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
        )
        await self.put_experiment(bus)
        yield

    def make_adapter(self, workspace: Path) -> FrameworkcontrollerAdapter:
        settings = FrameworkcontrollerSettings(
            replica="contract",
            kubeconfig=self.kubeconfig,
            share_mounts={NFS: workspace / "share"},
            watch_timeout=5,
            status_interval=0.5,
            gateway_url=NO_GATEWAY,
        )
        return FrameworkcontrollerAdapter(settings)

    def training_service(self, command: str) -> FrameworkcontrollerConfig:
        """The Framework runs its one task role's command, the contract's ``command``."""
        return role_command(self.service, command)


def role_command(service: FrameworkcontrollerConfig, command: str) -> FrameworkcontrollerConfig:
    """``service`` whose one task role runs ``command``."""
    [role] = service.task_roles
    return service.model_copy(update={"task_roles": [role.model_copy(update={"command": command})]})
