"""The remote adapter: each trial is a trial keeper process group on one of the experiment's
SSH machines (NNI's ``platform: remote``).

Per machine there is one SSH connection and one agent on it (``client.py``, ``agent.py``).
A launch picks the machine with the most free room (``placement.py``), uploads the code
snapshot there once, and has the agent create the trial directory (the idempotency point)
and fork the keeper in its own session. The keeper runs detached: trials survive a dropped
connection and an adapter restart, and their state lives in the trial directory. Each
trial's checkpoint directory is copied to the object store while it runs and put on the
machine of its next attempt (``checkpoints.py``), so that a retry elsewhere resumes from it.

:class:`RemoteAdapter` is a small facade over its parts, each owning its state and handed what
it needs when it is made: the attempts it keeps (:class:`~.trial.TrialTable`), where trials go
(:class:`~.placement.MachinePlacement`), the connections (:class:`~.pool.MachinePool`), their
status, stops and the relay of undelivered metrics (:class:`~.watching.Watcher`), launching
(:class:`~.launching.Launcher`), and what outlives the adapter: adoption, a machine that comes
back, released trials' logs, retention (:class:`~.restarts.Restarts`). The copies of checkpoint
directories are :class:`~.checkpoints.CheckpointSync`'s.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from contracts import ExperimentState, ExperimentStatus, TrainingService, TrialRequest
from contracts.experiment import RemoteConfig
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.keeper import Bundle
from services.adapters.remote.checkpoints import CheckpointSync
from services.adapters.remote.client import AGENT_FILES, Machine
from services.adapters.remote.launching import Launcher
from services.adapters.remote.placement import MachinePlacement
from services.adapters.remote.pool import MachinePool
from services.adapters.remote.restarts import Restarts
from services.adapters.remote.settings import RemoteSettings
from services.adapters.remote.trial import TrialTable
from services.adapters.remote.watching import Watcher
from services.common import platforms
from services.common.bus import Bus
from services.common.tasks import cancel_and_wait
from services.trial_keeper import WARM_FILES


class RemoteAdapter(PlatformAdapter):
    name = "remote"

    def __init__(self, settings: RemoteSettings, keeper_path: Path | None = None, shim_path: Path | None = None):
        if keeper_path is None or shim_path is None:
            from services.trial_keeper import KEEPER_PATH, SHIM_PATH

            keeper_path, shim_path = keeper_path or KEEPER_PATH, shim_path or SHIM_PATH
        self.settings = settings
        self.bundle = Bundle(keeper_path, shim_path, {**AGENT_FILES, **WARM_FILES})
        self.checkpoints = CheckpointSync(settings, self.notify)
        self.trials = TrialTable(self.checkpoints.track)
        self.placement = MachinePlacement(settings, self.name, self.trials.values, self.capacity_freed)
        self.pool = MachinePool(
            settings=settings,
            bundle=self.bundle,
            trials=self.trials,
            placement=self.placement,
            on_event=self._on_agent_event,
            on_up=self._on_up,
        )
        self.watcher = Watcher(
            settings=settings, trials=self.trials, pool=self.pool, checkpoints=self.checkpoints, notify=self.notify
        )
        self.launcher = Launcher(
            settings=settings,
            bundle=self.bundle,
            pool=self.pool,
            placement=self.placement,
            trials=self.trials,
            checkpoints=self.checkpoints,
            refresh=self.watcher.refresh,
        )
        self.restarts = Restarts(
            settings=settings,
            pool=self.pool,
            trials=self.trials,
            placement=self.placement,
            refresh=self.watcher.refresh,
            found=self.found,
            notify=self.notify,
            capacity_freed=self.capacity_freed,
        )
        self._bus: Bus | None = None
        self._loops: list[asyncio.Task] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self.watcher.start()
        self.launcher.start(bus)
        self.checkpoints.start(bus)
        self._loops = [
            asyncio.create_task(self.watcher.loop()),
            asyncio.create_task(self.restarts.retention_loop()),
            asyncio.create_task(platforms.watch_experiments(bus, self._on_experiment)),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._loops)
        await self.checkpoints.stop()
        await self.placement.stop()
        for trial in self.trials:
            if trial.kill is not None:
                trial.kill.cancel()
        await self.pool.close()
        await self.watcher.stop()

    async def adopt(self) -> list[TrialHandle]:
        """Trials on the machines of the experiments on the bus that this adapter left running."""
        machines = []
        assert self._bus is not None  # trials are adopted once started
        for state in await platforms.experiments(self._bus):
            if isinstance(service := state.config.service_for(self.name), RemoteConfig):
                machines.extend(service.machine_list)
        return await self.restarts.adopt(machines)

    # ------------------------------------------------------------------ the plug-in point, by part

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        return await self.launcher.launch(request)

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        return await self.watcher.poll(handle)

    async def cancel(self, handle: TrialHandle) -> None:
        await self.watcher.cancel(handle)

    async def release(self, handle: TrialHandle) -> None:
        await self.restarts.release(handle)

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        return await self.restarts.past(experiment_id, trial_id, attempt)

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        return await self.restarts.log_tail(handle, max_bytes)

    async def check(self, service: TrainingService) -> list[str]:
        return await self.pool.check(service)

    def describe(self) -> dict:
        return self.pool.describe()

    # ------------------------------------------------------------------ wiring

    def _on_experiment(self, state: ExperimentState) -> None:
        service = state.config.service_for(self.name)
        remote = service if isinstance(service, RemoteConfig) else None
        if remote is not None:
            self.checkpoints.configure(state.id, remote)
        self.pool.want(state.id, remote if state.status == ExperimentStatus.RUNNING else None)

    def _on_agent_event(self, machine: Machine, message: dict) -> None:
        self.watcher.on_agent_event(machine, message)

    def _on_up(self, machine: Machine) -> None:
        """A machine is (back) up: settle what waited for it, look for trials, wake waiters."""
        asyncio.ensure_future(self.restarts.reconnected(machine))
