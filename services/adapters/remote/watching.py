"""Watching the trials on SSH machines: their status, their end, their stop, and the metrics
their keepers could not deliver.

The agent pushes a keeper's exit at once; every ``status_poll`` seconds the adapter also reads
every running trial's ``state.json`` in one request per machine. While a machine is unreachable
its trials are RUNNING with a message saying so (:class:`Stale`), until it is back or
``unreachable_timeout`` passes (then FAILED, end unknown; killed if it comes back). A cancel is
SIGTERM to the keeper, then SIGKILL to the trial's group after its grace period.

When a machine cannot reach the gateway its keepers spool metrics; batches older than
``relay_after`` are read over SSH, posted to the gateway with the trial's token, and deleted
(:meth:`Watcher.relay`): nothing is lost, and the gateway drops duplicates.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

import httpx

from contracts import TrialStatus
from services.adapters.base import TrialHandle, TrialOutcome
from services.adapters.errors import Stale, TransientError
from services.adapters.keeper import outcome_of
from services.adapters.remote.checkpoints import CheckpointSync
from services.adapters.remote.client import AgentError, Machine, MachineDown
from services.adapters.remote.pool import MachinePool
from services.adapters.remote.settings import RemoteSettings
from services.adapters.remote.trial import UNBORN_GRACE, Trial, TrialTable

log = logging.getLogger(__name__)


class Watcher:
    """How the remote adapter watches and stops trials (the module's docstring)."""

    def __init__(
        self,
        *,
        settings: RemoteSettings,
        trials: TrialTable,
        pool: MachinePool,
        checkpoints: CheckpointSync,
        notify: Callable[[TrialHandle | None], None],
    ) -> None:
        """``notify``: a trial's poll is due (:meth:`~services.adapters.base.PlatformAdapter.notify`)."""
        self.settings, self._trials, self._pool = settings, trials, pool
        self._checkpoints, self._notify = checkpoints, notify
        self._http: httpx.AsyncClient | None = None  # for the relay, open between start and stop

    def start(self) -> None:
        self._http = httpx.AsyncClient(timeout=10)

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        trial = self._trials.find(handle)
        if trial.outcome is not None:
            return trial.outcome
        machine = trial.machine
        if not machine.up.is_set():
            down_for = time.monotonic() - (machine.down_since or time.monotonic())
            if down_for > self.settings.unreachable_timeout:
                self._pool.kill_when_back(machine, trial.dir)
                why = f"{machine.down_reason()}; gave up after {self.settings.unreachable_timeout:g}s"
                trial.outcome = TrialOutcome(
                    TrialStatus.FAILED, None, why + ": the trial's real end is unknown", "infrastructure"
                )
                return trial.outcome
            raise Stale(f"{machine.down_reason()}; status and metrics resume when it is back", delay=1.0)
        status = trial.status
        if not status:
            return None  # not read yet
        state, alive = status.get("state") or {}, status.get("alive")
        if alive:
            return None
        if status.get("spool"):  # the keeper is gone with metrics undelivered: relay them first
            if trial.relaying:
                return None
            await self.relay(trial, min_age=0.0)
        if not status.get("exists", True):
            why = f"trial directory {trial.dir} is gone from {machine.name}"
            outcome = TrialOutcome(TrialStatus.FAILED, None, why, "infrastructure")
        elif not state:
            if time.time() - trial.handle.start_time.timestamp() < UNBORN_GRACE:
                return None
            outcome = outcome_of({}, None, None)
        else:
            if not state.get("done") and "exitCode" not in state and state.get("keeperPid"):
                await machine.call("signal", dir=trial.dir, signal=signal.SIGKILL, group=True)  # no orphans
            outcome = outcome_of(state, state.get("keeperExit"))
        if self._checkpoints.finishing(trial.checkpoint):  # its last copy first: the next attempt may need it
            return None
        trial.outcome = outcome
        return outcome

    async def cancel(self, handle: TrialHandle) -> None:
        trial = self._trials.find(handle)
        if not trial.running:
            return
        result = await trial.machine.call("signal", dir=trial.dir, signal=signal.SIGTERM)
        if not result.get("sent") and not (trial.status.get("state") or {}).get("keeperPid"):
            raise TransientError("the trial keeper has not started yet", delay=0.2)
        if trial.kill is None:
            loop = asyncio.get_running_loop()
            grace = self.settings.kill_grace if trial.grace is None else trial.grace
            trial.kill = loop.call_later(grace + 1.0, self._force_stop, trial)

    def _force_stop(self, trial: Trial) -> None:
        if trial.running and trial.machine.up.is_set():
            log.warning("trial %s still running after cancel: SIGKILL", trial.handle.trial_id)
            asyncio.ensure_future(trial.machine.call("signal", dir=trial.dir, signal=signal.SIGKILL, group=True))

    async def loop(self) -> None:
        """Every ``status_poll`` seconds: read the running trials of each machine that is up, then
        close the idle connections."""
        while True:
            await asyncio.sleep(self.settings.status_poll)
            by_machine: dict[str, list[Trial]] = {}
            for trial in self._trials.values():
                if trial.running and trial.machine.up.is_set():
                    by_machine.setdefault(trial.machine.key, []).append(trial)
            results = await asyncio.gather(
                *(self.refresh(self._pool.machines[name], trials) for name, trials in by_machine.items()),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, MachineDown):
                    log.warning("cannot read trial status: %s", result)
            await self._pool.prune()

    async def refresh(self, machine: Machine, trials: list[Trial]) -> None:
        """Read the trials' status in one request (with the signatures of the checkpoint directories
        due a look); wake the ended ones; relay stuck metrics; copy changed checkpoints."""
        looks = {t.dir: t.checkpoint.directory for t in trials if self._checkpoints.due(t.checkpoint)}
        found = await machine.call("status", dirs=[t.dir for t in trials], checkpoints=looks)
        for trial in trials:
            status = found.get(trial.dir)
            if status is None:
                continue
            trial.status = status
            if "checkpoint" in status:
                self._checkpoints.seen(trial.checkpoint, status["checkpoint"])
            if not status["alive"]:
                self._notify(trial.handle)
            stuck = [name for name, age in status["spool"] if age >= self.settings.relay_after]
            if stuck and not trial.relaying:
                asyncio.ensure_future(self.relay(trial))

    async def relay(self, trial: Trial, min_age: float | None = None) -> None:
        """Post a keeper's undelivered batches to the gateway ourselves, in order, then delete
        them (one relay per trial at a time)."""
        if trial.relaying:
            return
        trial.relaying = True
        try:
            age = self.settings.relay_after if min_age is None else min_age
            found = await trial.machine.call("spool", dir=trial.dir, minAge=age)
            url = f"{self.settings.gateway_url.rstrip('/')}/api/v1/trials/{trial.handle.trial_id}/metrics"
            for name, records in found["files"]:
                body = {"experimentId": trial.handle.experiment_id, "attempt": trial.handle.attempt, "records": records}
                headers = {
                    "Authorization": f"Bearer {found['token']}",
                    "X-Trialbus-Keeper-Version": trial.machine.keeper_version,
                }
                assert self._http is not None  # relays run between start and stop
                reply = await self._http.post(url, json=body, headers=headers)
                if reply.status_code != 200:
                    log.warning(
                        "the gateway refused relayed metrics of %s (%d): %s",
                        trial.handle.trial_id,
                        reply.status_code,
                        reply.text[:300],
                    )
                    return
                await trial.machine.call("unspool", dir=trial.dir, names=[name])
                log.info(
                    "relayed %d metric records of %s from %s over SSH",
                    len(records),
                    trial.handle.trial_id,
                    trial.machine.name,
                )
        except (MachineDown, AgentError, httpx.HTTPError) as exc:
            log.warning("cannot relay metrics of %s now: %s", trial.handle.trial_id, exc)
        finally:
            trial.relaying = False

    def on_agent_event(self, machine: Machine, message: dict) -> None:
        """An agent's event: a keeper exited there (read its trial's status at once)."""
        if message.get("event") != "exit":
            return
        trials = [t for t in self._trials.values() if t.dir == message.get("dir") and t.machine is machine]
        if trials:
            asyncio.ensure_future(self._refresh_quietly(machine, trials))

    async def _refresh_quietly(self, machine: Machine, trials: list[Trial]) -> None:
        try:
            await self.refresh(machine, trials)
        except (MachineDown, AgentError) as exc:
            log.warning("cannot read the status of an ended trial now: %s", exc)
