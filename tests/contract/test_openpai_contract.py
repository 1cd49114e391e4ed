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

from contracts import sealing
from contracts.experiment import OpenpaiConfig
from services.adapters.openpai import OpenpaiAdapter, OpenpaiSettings
from services.common.bus import Bus
from tests.contract.adapter_contract import NO_GATEWAY, AdapterContract
from tests.fixtures.openpai import pai, share  # noqa: F401 - fixtures


class TestOpenpaiAdapter(AdapterContract):
    capacity = 2
    #: A stopped job's end reaches the adapter with its next read of the jobs' states.
    cancel_within = 3.0
    #: The adapter calls ``notify`` at every change of a job's state it reads (WAITING, RUNNING,
    #: then the end), not only at the end.
    notifies_while_running = True
    #: OpenPAI queues a job its virtual cluster has no room for (the job waits, and the trial's
    #: message says so after ``queue_note_after``).
    queues = True

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
        await self.put_experiment(bus, trialGpuNumber=0)
        yield
        sealing.install(None)

    def make_adapter(self, workspace: Path) -> OpenpaiAdapter:
        settings = OpenpaiSettings(
            replica="contract",
            status_poll=0.3,
            secrets_key=self.key,
            gateway_url=NO_GATEWAY,
        )
        return OpenpaiAdapter(settings)
