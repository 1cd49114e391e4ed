"""Trials that outlive the remote adapter, and the directories they leave on the machines.

Keepers run detached, so after a restart the adapter adopts, from each machine of the experiments
on the bus, every trial directory not yet reported (:meth:`Restarts.adopt`); a machine unreachable
then is settled when it is back (:meth:`Restarts.reconnected`): what waited for it in the pool is
done, the trials it runs that this adapter does not know are adopted, and the ones it knows read at
once. A released attempt's directory is marked reported, stays readable for its logs
(:meth:`Restarts.past`, :meth:`Restarts.log_tail`), and is removed ``trial_retention`` seconds later
by the agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from contracts.experiment import RemoteMachineConfig
from services.adapters.base import TrialHandle
from services.adapters.remote.client import AgentError, Machine, MachineDown
from services.adapters.remote.placement import MachinePlacement
from services.adapters.remote.pool import MachinePool
from services.adapters.remote.settings import RemoteSettings
from services.adapters.remote.trial import Trial, TrialTable

log = logging.getLogger(__name__)


class Restarts:
    """What outlives the remote adapter (the module's docstring)."""

    def __init__(
        self,
        *,
        settings: RemoteSettings,
        pool: MachinePool,
        trials: TrialTable,
        placement: MachinePlacement,
        refresh: Callable[[Machine, list[Trial]], Awaitable[None]],
        found: Callable[[TrialHandle], None],
        notify: Callable[[], None],
        capacity_freed: Callable[[], None],
    ) -> None:
        """``refresh`` reads trials' status now; ``found``, ``notify`` and ``capacity_freed`` are the
        adapter's (:class:`~services.adapters.base.PlatformAdapter`): a trial adopted late, poll all,
        room may have freed."""
        self.settings, self._pool, self._trials, self._placement = settings, pool, trials, placement
        self._refresh, self._found, self._notify, self._capacity_freed = refresh, found, notify, capacity_freed
        #: While :meth:`adopt` runs: the trials :meth:`reconnected` adopted meanwhile (a machine that came
        #: up during it), which ``adopt`` returns with its own instead of handing them to ``found``.
        self._early: list[TrialHandle] | None = None

    async def adopt(self, machines: Iterable[RemoteMachineConfig]) -> list[TrialHandle]:
        """Trials that this adapter left running on these machines (those of the experiments on the
        bus) and on the machines it is connected to."""
        early = self._early = []
        try:
            for config in machines:
                self._pool.machine(config)
            await asyncio.gather(*(m.ready(wait=0) for m in self._pool.values()))
            handles = []
            for machine in self._pool.values():
                if not machine.up.is_set():
                    log.warning("cannot adopt trials on %s now (%s); will when it is back", machine.name, machine.error)
                    continue
                for entry in await machine.call("list"):
                    key = (entry["trial"], entry["attempt"])
                    if key not in self._trials:
                        handles.append(self._adopt_entry(machine, entry).handle)
        except BaseException:
            self._early = None
            for handle in early:  # tracked already: handed over as found, not lost with the failed adopt
                self._found(handle)
            raise
        self._early = None
        return handles + early

    async def reconnected(self, machine: Machine) -> None:
        """A machine is (back) up: settle what waited for it, look for trials, wake waiters."""
        try:
            await self._pool.settle(machine)
            found = await machine.call("list")
            for entry in found:
                key = (entry["trial"], entry["attempt"])
                if key not in self._trials:
                    trial = self._adopt_entry(machine, entry)
                    if self._early is not None:  # adopt() is running: it returns this trial
                        self._early.append(trial.handle)
                    else:
                        self._found(trial.handle)
            ours = self._trials.running_on(machine)
            if ours:
                await self._refresh(machine, ours)
            if (scheduler := self._placement.gpus.get(machine.key)) is not None:
                await scheduler.read()
        except (MachineDown, AgentError) as exc:
            log.warning("cannot settle %s after reconnecting: %s", machine.name, exc)
        self._capacity_freed()
        self._notify()

    def _adopt_entry(self, machine: Machine, entry: dict) -> Trial:
        state = entry.get("state") or {}
        started = datetime.fromtimestamp(state.get("startTime") or entry["mtime"], UTC)
        trial = self._trials.track(
            entry["experiment"], entry["trial"], entry["attempt"], machine, entry["dir"], started
        )
        trial.status = {"state": state, "alive": True, "spool": []}  # until the next read says otherwise
        if gpus := entry.get("gpus"):
            trial.gpus, trial.per_gpu = tuple(gpus["indices"]), int(gpus["perGpu"])
        return trial

    async def release(self, handle: TrialHandle) -> None:
        trial = self._trials.pop((handle.trial_id, handle.attempt))
        if trial is None:
            return
        if trial.kill is not None:
            trial.kill.cancel()
        try:
            await trial.machine.call("report", dir=trial.dir)
        except MachineDown:
            self._pool.report_when_back(trial.machine, trial.dir)

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        """An attempt (the newest by default) of a finished trial whose directory a connected machine keeps."""
        for machine in list(self._pool.values()):
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

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        trial = self._trials.get((handle.trial_id, handle.attempt))
        machine = trial.machine if trial else self._pool.of(handle.ref)
        if machine is None:
            return ""
        found = await machine.call("tail", dir=handle.ref.split("#", 1)[1], max=max_bytes)
        return "\n".join(f"==> {name} <==\n{text}" for name, text in found.items())

    async def retention_loop(self) -> None:
        """Have each machine's agent remove the finished trials' directories past ``trial_retention``."""
        retention = self.settings.trial_retention
        while retention:
            await asyncio.sleep(min(3600.0, max(1.0, retention / 4)))
            for machine in list(self._pool.values()):
                try:
                    found = await machine.call("clean", retention=retention, timeout=300)
                    if found["removed"]:
                        log.info("removed %d finished trial directories on %s", found["removed"], machine.name)
                except (MachineDown, AgentError):
                    continue
