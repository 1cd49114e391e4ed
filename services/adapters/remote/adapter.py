"""The remote adapter: each trial is a trial keeper process group on one of the experiment's
SSH machines (NNI's ``platform: remote``).

Per machine there is one SSH connection and one agent on it (``client.py``, ``agent.py``).
A launch picks the machine with the most free room (``placement.py``), uploads the code
snapshot there once, and has the agent create the trial directory (the idempotency point)
and fork the keeper in its own session. The keeper runs detached: trials survive a dropped
connection and an adapter restart, and their state lives in the trial directory. Each
trial's checkpoint directory is copied to the object store while it runs and put on the
machine of its next attempt (``checkpoints.py``), so that a retry elsewhere resumes from it.

:class:`RemoteAdapter` is this module's state, start, stop and shared bookkeeping, plus one
mixin per part: the pool of machines (``pool.py``), launching (``launching.py``), status,
stops and the relay of undelivered metrics (``watching.py``), and what outlives the adapter:
adoption, released trials' logs, retention (``restarts.py``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from contracts import ExperimentState, ExperimentStatus
from contracts.experiment import RemoteConfig
from services.adapters.base import PlatformAdapter, TrialHandle
from services.adapters.errors import PermanentError
from services.adapters.keeper import Bundle
from services.adapters.remote.checkpoints import CheckpointSync
from services.adapters.remote.client import AGENT_FILES, Machine, machine_key
from services.adapters.remote.launching import Launching
from services.adapters.remote.placement import MachinePlacement
from services.adapters.remote.pool import MachinePool
from services.adapters.remote.restarts import Restarts
from services.adapters.remote.settings import RemoteSettings
from services.adapters.remote.trial import Trial
from services.adapters.remote.watching import Watching
from services.common import platforms
from services.common.bus import Bus
from services.trial_keeper import WARM_FILES


class RemoteAdapter(MachinePool, Launching, Watching, Restarts, PlatformAdapter):
    name = "remote"

    def __init__(self, settings: RemoteSettings, keeper_path: Path | None = None, shim_path: Path | None = None):
        if keeper_path is None or shim_path is None:
            from services.trial_keeper import KEEPER_PATH, SHIM_PATH

            keeper_path, shim_path = keeper_path or KEEPER_PATH, shim_path or SHIM_PATH
        self.settings = settings
        self.bundle = Bundle(keeper_path, shim_path, {**AGENT_FILES, **WARM_FILES})
        self.machines: dict[str, Machine] = {}
        self.trials: dict[tuple[str, int], Trial] = {}
        self.placement = MachinePlacement(settings, self.name, self.trials.values, self.capacity_freed)
        self.abandoned: dict[str, set[str]] = {}  # machine → trial dirs given up on: kill when back
        self.unreported: dict[str, set[str]] = {}  # machine → trial dirs to mark reported when back
        self.wanted: dict[str, set[str]] = {}  # running experiment → the keys of its machines
        self._bus: Bus | None = None
        self._http: httpx.AsyncClient | None = None
        self._loops: list[asyncio.Task] = []
        self._archives: dict[str, asyncio.Task] = {}
        self.checkpoints = CheckpointSync(settings, self.notify)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._http = httpx.AsyncClient(timeout=10)
        self.checkpoints.start(bus)
        self._loops = [asyncio.create_task(self._status_loop()), asyncio.create_task(self._retention_loop()),
                       asyncio.create_task(platforms.watch_experiments(bus, self._on_experiment))]  # fmt: skip

    async def stop(self) -> None:
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await self.checkpoints.stop()
        await self.placement.stop()
        for trial in self.trials.values():
            if trial.kill is not None:
                trial.kill.cancel()
        await asyncio.gather(*(m.close() for m in self.machines.values()), return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    # ------------------------------------------------------------------ bookkeeping

    def _on_experiment(self, state: ExperimentState) -> None:
        service = state.config.service_for(self.name)
        if isinstance(service, RemoteConfig):
            self.checkpoints.configure(state.id, service)
        if state.status == ExperimentStatus.RUNNING and isinstance(service, RemoteConfig):
            self.wanted[state.id] = {machine_key(m) for m in service.machine_list}
        else:
            self.wanted.pop(state.id, None)

    def _track(self, experiment_id, trial_id, attempt, machine: Machine, trial_dir: str, started) -> Trial:
        handle = TrialHandle(experiment_id, trial_id, attempt, ref=f"{machine.key}#{trial_dir}", start_time=started)
        trial = self.trials[(trial_id, attempt)] = Trial(handle, machine, trial_dir)
        trial.checkpoint = self.checkpoints.track(handle, machine)
        return trial

    def _find(self, handle: TrialHandle) -> Trial:
        trial = self.trials.get((handle.trial_id, handle.attempt))
        if trial is None:
            raise PermanentError(f"trial {handle.trial_id} attempt {handle.attempt} is not known to this replica")
        return trial

    def _machine_of(self, ref: str) -> Machine | None:
        return self.machines.get(ref.split("#", 1)[0]) if "#" in ref else None
