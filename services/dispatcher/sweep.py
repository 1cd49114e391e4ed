"""The dispatcher's sweep, once a second: what depends on time rather than on a message.

Deferred states KV has not taken yet, requests not known to be on the stream, cancels not
honoured yet, ``maxTrialDuration``, silent trials (:mod:`.liveness`), hybrid trials to take
back from a platform that went down, retries whose back-off is over, ``maxExperimentDuration``,
experiments that are done, and the preemptions teams' shares call for (:mod:`.shares`); and, as
soon as capacity frees on a platform teams share, the experiments waiting for it. It owns no state:
it acts through the trials' ends (:mod:`.ends`), attempts (:mod:`.attempts`), cancels
(:mod:`.cancels`) and slots (:mod:`.slots`).
Each sweep costs O(unfinished trials of the RUNNING experiments): the store's index keeps them apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import timedelta

from contracts.base import utcnow
from contracts.state import ExperimentStatus, TrialStatus
from services.dispatcher.attempts import Attempts
from services.dispatcher.cancels import CancelRequests
from services.dispatcher.ends import Ends, duration_over
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)
#: Seconds between two cancel requests for a trial whose owner has not ended it yet.
CANCEL_RETRY = 3.0


class Sweep:
    """The sweep of the dispatcher (the module's docstring); ``locks``: experiment → its lock."""

    def __init__(
        self,
        *,
        store: StateStore,
        slots: Slots,
        cancels: CancelRequests,
        ends: Ends,
        attempts: Attempts,
        locks: Mapping[str, asyncio.Lock],
    ) -> None:
        self._store = store
        self._slots = slots
        self._cancels = cancels
        self._ends = ends
        self._attempts = attempts
        self._locks = locks

    async def run(self) -> None:
        """Once a second: limits that depend on time, cancels not yet honoured, finished experiments."""
        now = utcnow()
        loop_time = asyncio.get_running_loop().time()
        # Deferred states whose write failed: KV catches up. (Not every deferred state: most wait
        # for their group commit, which writes each a moment later with what changes meanwhile.)
        if self._store.write_failed and self._store.dirty:
            self._store.write_failed = False
            try:
                await self._store.flush(list(self._store.dirty))
            except Exception as exc:
                log.warning("writing %d trial states failed (%s); will retry", len(self._store.dirty), exc)
        for trial_id in list(self._slots.unsent):
            trial = self._store.trials[trial_id]
            async with self._locks[trial.experiment_id]:
                if trial_id in self._slots.unsent and not self._store.trials[trial_id].status.terminal:
                    await self._slots.send(self._store.trials[trial_id])
        for state in list(self._store.experiments.values()):
            if state.status != ExperimentStatus.RUNNING:
                continue
            async with self._locks[state.id]:
                limit, silence = state.config.max_trial_duration, state.config.retry_policy.heartbeat_timeout
                for trial in self._store.unfinished(state.id):
                    if (trial := self._store.trials[trial.id]).status.terminal:  # ended by an earlier step here
                        continue
                    if silence and trial.status == TrialStatus.RUNNING and not trial.cancel_status:
                        await self._attempts.silence(trial, silence)
                        if (trial := self._store.trials[trial.id]).status != TrialStatus.RUNNING:
                            continue  # lost for good: it ended, or waits for its next attempt
                    if trial.cancel_status:
                        if loop_time - self._cancels.sent_at(trial.id) > CANCEL_RETRY:
                            await self._ends.cancel(trial, trial.cancel_status, trial.message)
                    elif limit and trial.start_time and now - trial.start_time > timedelta(seconds=limit):
                        await self._ends.cancel(
                            trial, TrialStatus.EARLY_STOPPED, f"trial ran longer than maxTrialDuration ({limit:g}s)"
                        )
                if state.config.hybrid:
                    await self._slots.take_back(state)
                self._slots.due(state.id, now)
                if duration_over(state):
                    for trial_id in [*self._slots.queue[state.id], *self._slots.later[state.id]]:
                        await self._ends.end(
                            self._store.trials[trial_id],
                            TrialStatus.SYS_CANCELED,
                            "maxExperimentDuration was reached before the trial could start",
                        )
                await self._slots.dispatch_ready(state.id)
                await self._ends.finish_if_done(state.id)
        await self.preempt()

    async def preempt(self) -> None:
        """Preempt what :meth:`Shares.reclaim` says, in every pool teams wait for. O(waiting
        experiments × trials holding the pool)."""
        shares, store = self._slots.shares, self._store

        def running(trial_id: str) -> bool:
            trial = store.trials.get(trial_id)
            return trial is not None and trial.status == TrialStatus.RUNNING and not trial.cancel_status

        for pool in [p for p, waiting in shares.demands.items() if waiting]:
            for victim in shares.reclaim(pool, self._slots.placement.capacity(pool), running):
                async with self._locks[victim.experiment]:
                    if victim.trial_id in store.trials:
                        await self._attempts.preempt(store.trials[victim.trial_id], victim.why)

    async def offer_freed(self) -> None:
        """Capacity freed in a shared pool: its waiting experiments take it, best first (the sweep
        would, within a second). O(waiting experiments of those pools)."""
        for pool in self._slots.take_freed():
            for demand in self._slots.shares.ranked(pool, self._slots.placement.capacity(pool)):
                async with self._locks[demand.experiment]:
                    await self._slots.dispatch_ready(demand.experiment)
