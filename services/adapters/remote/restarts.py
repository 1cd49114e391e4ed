"""Trials that outlive the remote adapter, and the directories they leave on the machines.

Keepers run detached, so after a restart the adapter adopts, from each machine of the experiments
on the bus, every trial directory not yet reported (:meth:`Restarts.adopt`); a machine unreachable
then is settled when it is back (``pool.py``). A released attempt's directory is marked reported,
stays readable for its logs (:meth:`Restarts.past`, :meth:`Restarts.log_tail`), and is removed
``trial_retention`` seconds later by the agent. Part of
:class:`~services.adapters.remote.adapter.RemoteAdapter` (a mixin).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from contracts.experiment import RemoteConfig
from services.adapters.base import TrialHandle
from services.adapters.remote.client import AgentError, Machine, MachineDown
from services.adapters.remote.trial import Trial
from services.common import platforms

if TYPE_CHECKING:
    from services.adapters.remote.adapter import RemoteAdapter

log = logging.getLogger(__name__)


class Restarts:
    """What outlives the remote adapter (the module's docstring)."""

    async def adopt(self: RemoteAdapter) -> list[TrialHandle]:
        """Trials on the machines of the experiments on the bus that this adapter left running."""
        for state in await platforms.experiments(self._bus):
            if isinstance(service := state.config.service_for(self.name), RemoteConfig):
                for config in service.machine_list:
                    self.machine(config)
        await asyncio.gather(*(m.ready(wait=0) for m in self.machines.values()))
        handles = []
        for machine in self.machines.values():
            if not machine.up.is_set():
                log.warning("cannot adopt trials on %s now (%s); will when it is back", machine.name, machine.error)
                continue
            for entry in await machine.call("list"):
                key = (entry["trial"], entry["attempt"])
                if key not in self.trials:
                    handles.append(self._adopt_entry(machine, entry).handle)
        return handles

    def _adopt_entry(self: RemoteAdapter, machine: Machine, entry: dict) -> Trial:
        state = entry.get("state") or {}
        started = datetime.fromtimestamp(state.get("startTime") or entry["mtime"], UTC)
        trial = self._track(entry["experiment"], entry["trial"], entry["attempt"], machine, entry["dir"], started)
        trial.status = {"state": state, "alive": True, "spool": []}  # until the next read says otherwise
        if gpus := entry.get("gpus"):
            trial.gpus, trial.per_gpu = tuple(gpus["indices"]), int(gpus["perGpu"])
        return trial

    async def release(self: RemoteAdapter, handle: TrialHandle) -> None:
        trial = self.trials.pop((handle.trial_id, handle.attempt), None)
        if trial is None:
            return
        if trial.kill is not None:
            trial.kill.cancel()
        try:
            await trial.machine.call("report", dir=trial.dir)
        except MachineDown:
            self.unreported.setdefault(trial.machine.key, set()).add(trial.dir)

    async def past(self: RemoteAdapter, experiment_id: str, trial_id: str,
                   attempt: int | None = None) -> TrialHandle | None:  # fmt: skip
        """An attempt (the newest by default) of a finished trial whose directory a connected machine keeps."""
        for machine in list(self.machines.values()):
            if not machine.up.is_set():
                continue
            try:
                found = await machine.call("find", experiment=experiment_id, trial=trial_id, attempt=attempt)
            except (MachineDown, AgentError):
                continue
            if found:
                ref = f"{machine.key}#{found['dir']}"
                return TrialHandle(experiment_id, trial_id, found["attempt"], ref=ref)
        return None

    async def log_tail(self: RemoteAdapter, handle: TrialHandle, max_bytes: int) -> str:
        trial = self.trials.get((handle.trial_id, handle.attempt))
        machine = trial.machine if trial else self._machine_of(handle.ref)
        if machine is None:
            return ""
        found = await machine.call("tail", dir=handle.ref.split("#", 1)[1], max=max_bytes)
        return "\n".join(f"==> {name} <==\n{text}" for name, text in found.items())

    async def _retention_loop(self: RemoteAdapter) -> None:
        retention = self.settings.trial_retention
        while retention:
            await asyncio.sleep(min(3600.0, max(1.0, retention / 4)))
            for machine in list(self.machines.values()):
                try:
                    found = await machine.call("clean", retention=retention, timeout=300)
                    if found["removed"]:
                        log.info("removed %d finished trial directories on %s", found["removed"], machine.name)
                except (MachineDown, AgentError):
                    continue
