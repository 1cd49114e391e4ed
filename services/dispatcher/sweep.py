"""The dispatcher's sweep, once a second: what depends on time rather than on a message.

Deferred states KV has not taken yet, requests not known to be on the stream, cancels not
honoured yet, ``maxTrialDuration``, silent trials (:mod:`.liveness`), hybrid trials to take
back from a platform that went down, retries whose back-off is over, ``maxExperimentDuration``,
and experiments that are done. Part of :class:`~services.dispatcher.core.Dispatcher` (a mixin).
Each sweep costs O(unfinished trials of the RUNNING experiments): the store's index keeps them apart.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from contracts.base import utcnow
from contracts.state import ExperimentStatus, TrialStatus

if TYPE_CHECKING:
    from services.dispatcher.core import Dispatcher

log = logging.getLogger(__name__)
#: Seconds between two cancel requests for a trial whose owner has not ended it yet.
CANCEL_RETRY = 3.0


class Sweep:
    """The sweep half of the dispatcher (the module's docstring)."""

    async def sweep(self: Dispatcher) -> None:
        """Once a second: limits that depend on time, cancels not yet honoured, finished experiments."""
        now = utcnow()
        loop_time = asyncio.get_running_loop().time()
        # Deferred states whose write failed: KV catches up. (Not every deferred state: most wait
        # for their group commit, which writes each a moment later with what changes meanwhile.)
        if self.store.write_failed and self.store.dirty:
            self.store.write_failed = False
            try:
                await self.store.flush(list(self.store.dirty))
            except Exception as exc:
                log.warning("writing %d trial states failed (%s); will retry", len(self.store.dirty), exc)
        for trial_id in list(self.slots.unsent):
            trial = self.store.trials[trial_id]
            async with self._locks[trial.experiment_id]:
                if trial_id in self.slots.unsent and not self.store.trials[trial_id].status.terminal:
                    await self.slots.send(self.store.trials[trial_id])
        for state in list(self.store.experiments.values()):
            if state.status != ExperimentStatus.RUNNING:
                continue
            async with self._locks[state.id]:
                limit, silence = state.config.max_trial_duration, state.config.retry_policy.heartbeat_timeout
                for trial in self.store.unfinished(state.id):
                    if (trial := self.store.trials[trial.id]).status.terminal:  # ended by an earlier step here
                        continue
                    if silence and trial.status == TrialStatus.RUNNING and not trial.cancel_status:
                        await self._silence(trial, silence)
                        if (trial := self.store.trials[trial.id]).status != TrialStatus.RUNNING:
                            continue  # lost for good: it ended, or waits for its next attempt
                    if trial.cancel_status:
                        if loop_time - self._cancel_sent.get(trial.id, 0.0) > CANCEL_RETRY:
                            await self._cancel(trial, trial.cancel_status, trial.message)
                    elif limit and trial.start_time and now - trial.start_time > timedelta(seconds=limit):
                        await self._cancel(
                            trial, TrialStatus.EARLY_STOPPED, f"trial ran longer than maxTrialDuration ({limit:g}s)"
                        )
                if state.config.hybrid:
                    await self.slots.take_back(state)
                self.slots.due(state.id, now)
                if self._duration_over(state):
                    for trial_id in [*self.slots.queue[state.id], *self.slots.later[state.id]]:
                        await self._end(
                            self.store.trials[trial_id],
                            TrialStatus.SYS_CANCELED,
                            "maxExperimentDuration was reached before the trial could start",
                        )
                await self.slots.dispatch_ready(state.id)
                await self._finish_if_done(state.id)
