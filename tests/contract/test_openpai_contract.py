"""The adapter contract against the openpai adapter: each trial an OpenPAI job on the emulator
(``tests/emulators/openpai``), through the adapter's production client over real HTTP.

The emulator runs each task as a process on this host, with the share (``tests/fixtures/openpai.py``)
at its container path. The cluster and its token come with each trial's ``trainingService`` and
with the experiment on the bus (where a restarted adapter finds its jobs again), as the
dispatcher puts it there: sealed, so the test holds a sealing key as the dispatcher does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contracts import ExperimentConfig, ExperimentState, TrialRequest, TrialStatus, sealing, streams
from contracts.base import utcnow
from contracts.experiment import OpenpaiConfig
from services.adapters.base import TrialHandle
from services.adapters.openpai import OpenpaiAdapter, OpenpaiSettings
from services.common.bus import Bus
from tests.contract.adapter_contract import AdapterContract, Harness, outcome_at_a_notify
from tests.fixtures.openpai import pai, share  # noqa: F401 - fixtures

EXPERIMENT = "contract"


class TestOpenpaiAdapter(AdapterContract):
    capacity = 2
    #: A stopped job's end reaches the adapter with its next read of the jobs' states.
    cancel_within = 3.0

    @pytest.fixture(autouse=True)
    async def cluster(self, pai, share, bus: Bus) -> AsyncIterator[None]:  # noqa: F811 - the imported fixtures
        """The emulator's cluster for user alice, and the experiment on the bus (sealed)."""
        local, container = share
        self.service = OpenpaiConfig.model_validate(
            {
                "platform": "openpai",
                "host": pai.url,
                "username": "alice",
                "token": pai.token("alice"),
                "trialCpuNumber": 1,
                "trialMemorySize": "1gb",
                "storageConfigName": "confignfs",
                "localStorageMountPoint": str(local),
                "containerStorageMountPoint": str(container),
            }
        )
        self.key = sealing.generate_key()
        sealing.install(self.key)
        config = ExperimentConfig.model_validate(
            {
                "trialCommand": "true",
                "trialConcurrency": self.capacity,
                "trialGpuNumber": 0,
                "trainingService": self.service,
            }
        )
        experiments = await bus.kv(streams.EXPERIMENTS_BUCKET.bucket)
        await experiments.put(EXPERIMENT, ExperimentState(id=EXPERIMENT, config=config, start_time=utcnow()).encode())
        yield
        sealing.install(None)

    def make_adapter(self, workspace: Path) -> OpenpaiAdapter:
        settings = OpenpaiSettings(
            replica="contract",
            status_poll=0.3,
            secrets_key=self.key,
            gateway_url="http://127.0.0.1:9",  # no gateway: trials here report no metrics
        )
        return OpenpaiAdapter(settings)

    def starts(self, workspace: Path, trial_id: str) -> int:
        marker = workspace / "starts" / trial_id
        return len(marker.read_text().splitlines()) if marker.exists() else 0

    def request(self, workspace: Path, duration: float = 0.0, exit_code: int = 0, attempt: int = 0) -> TrialRequest:
        request = super().request(workspace, duration, exit_code, attempt)
        return request.model_copy(update={"training_service": self.service})

    # ------------------------------------------------------------------ where the platform differs

    async def test_the_adapter_says_when_a_trial_ended(self, platform: Harness) -> None:
        """The openpai adapter calls ``notify`` at every change of a job's state it reads (WAITING,
        RUNNING, then the end), not only at the end. So: the trial is named, and at one of its
        namings (not ``poll_interval`` later) ``poll`` says how it ended."""
        adapter = await platform.adapter()
        named: list[TrialHandle | None] = []
        adapter.listen(named.append)

        handle = await adapter.launch(platform.request(duration=0.2))

        outcome = await outcome_at_a_notify(adapter, handle, named, 0.2 + self.slack)
        assert outcome.status is TrialStatus.SUCCEEDED, outcome

    async def test_no_capacity_is_none_until_a_trial_ends(self, platform: Harness) -> None:
        """OpenPAI queues a job its virtual cluster has no room for (the job waits, and the trial's
        message says so after ``queue_note_after``): the adapter hands every trial to the cluster
        and never answers None. So: more trials than :attr:`capacity` are all taken, each its own
        job, and all of them start."""
        adapter = await platform.adapter()
        running = [await adapter.launch(platform.request(duration=60)) for _ in range(self.capacity + 1)]

        assert all(running) and len(set(running)) == len(running)
        for handle in running:
            await platform.until_started(handle)
            assert await adapter.poll(handle) is None
