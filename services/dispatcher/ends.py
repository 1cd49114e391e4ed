"""How a trial ends, and with it maybe its experiment: the dispatcher's own ends (a cancel
before dispatch, a limit, an attempt that runs out of retries), cancels of dispatched trials
(the owner is asked; its end event ends the trial), and an experiment that is DONE once it
takes no more trials and the submitted ones have ended.

Every method runs under the experiment's lock (its callers hold it). An end frees the trial's
slot at once and dispatches what waits; a decision of the dispatcher's own goes to the
trial's history too (an event on ``events.<experiment>.<trial>.dispatcher``). O(1) per trial,
except :meth:`Ends.cancel_all`, O(trials).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from contracts import subjects
from contracts.base import utcnow
from contracts.messages import TrialEvent
from contracts.retries import Failure
from contracts.state import ExperimentState, ExperimentStatus, TrialState, TrialStatus
from services.common.bus import Bus
from services.dispatcher.cancels import AT_ONCE, CancelRequests, at_most
from services.dispatcher.failfast import FailFast
from services.dispatcher.liveness import Liveness
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)


def duration_over(state: ExperimentState) -> bool:
    """Whether the experiment has run for its ``maxExperimentDuration``."""
    limit = state.config.max_experiment_duration
    return limit is not None and state.run_time(utcnow()) >= timedelta(seconds=limit)


class Ends:
    """Ending and canceling trials, finishing experiments (the module's docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: StateStore,
        slots: Slots,
        liveness: Liveness,
        cancels: CancelRequests,
        fail_fast: FailFast,
    ) -> None:
        self._bus = bus
        self._store = store
        self._slots = slots
        self._liveness = liveness
        self._cancels = cancels
        self._fail_fast = fail_fast

    async def end(
        self,
        trial: TrialState,
        status: TrialStatus,
        message: str | None,
        *,
        exit_code: int | None = None,
        when=None,
        publish: bool = True,
        sends: list[TrialState] | None = None,
        failure: Failure | None = None,
        last_error: str | None = None,
    ) -> TrialState:
        """End a trial: free its slot, dispatch what waits, maybe finish the experiment, or stop it
        when its first trials all failed alike (:mod:`.failfast`).

        With ``sends``, the new state goes to the cache only, for the caller to ``flush``,
        and the trials that take the slot are added to ``sends`` for the caller to send.
        """
        trial = trial.model_copy(
            update={
                "status": status,
                "end_time": when or utcnow(),
                "message": message,
                "exit_code": exit_code if exit_code is not None else trial.exit_code,
                "failure": failure,
                "retry_at": None,
                "last_error": last_error,
            }
        )
        self._slots.free(trial)
        self._cancels.forget(trial.id)
        self._liveness.forget(trial.id)
        # The slot is free at once (the platform's is: every caller ends a trial that is not
        # running there): the next trial goes out while this end is written. A write-through
        # that fails leaves the cache as it was, and the caller applies the end again; a
        # deferred one stays dirty until written (see StateStore).
        if sends is not None:
            self._store.defer(trial)
            sends += self._slots.take_ready(trial.experiment_id)
        else:
            await asyncio.gather(self._store.put_trial(trial), self._slots.dispatch_ready(trial.experiment_id))
        if publish:  # a decision of the dispatcher's own: put it in the history too
            await self.publish(trial, status)
        log.info("trial %s %s%s", trial.id, status.value, f": {message}" if message else "")
        await self.finish_if_done(trial.experiment_id)
        self._fail_fast.ended(trial, self._store.experiments[trial.experiment_id])
        return trial

    async def cancel(self, trial: TrialState, status: TrialStatus, message: str | None) -> TrialState:
        """Cancel a trial: ended here if it was never dispatched or its request is still unclaimed,
        else marked (``cancel_status``) and its owner asked to stop it."""
        if not trial.dispatched:
            return await self.end(trial, status, message)
        if trial.cancel_status is None:
            trial = trial.model_copy(update={"cancel_status": status, "message": message})
            await self._store.put_trial(trial)
        if trial.status == TrialStatus.WAITING and await self._slots.withdraw(trial):  # not claimed yet
            return await self.end(trial, trial.cancel_status or status, message)  # marked above: never None
        await self._cancels.ask(trial)
        return self._store.trials[trial.id]

    async def cancel_all(self, trials: list[TrialState], status: TrialStatus, message: str) -> None:
        """:meth:`cancel` for many trials (a stopped experiment's unfinished ones): what changes queues
        and slots one trial at a time, the KV writes :data:`AT_ONCE` at a time, and the owners asked
        in the background, as many at a time (one by one and awaited, 1,000 running trials took
        6–10 s to stop). O(trials)."""
        for trial in [t for t in trials if not t.dispatched]:
            await self.end(trial, status, message)
        dispatched = [self._store.trials[t.id] for t in trials if t.dispatched]
        marked = [
            t.model_copy(update={"cancel_status": status, "message": message})
            for t in dispatched
            if t.cancel_status is None
        ]
        await at_most(AT_ONCE, (self._store.put_trial(t) for t in marked))
        asking = []
        for trial in (self._store.trials[t.id] for t in dispatched):
            if trial.status == TrialStatus.WAITING and await self._slots.withdraw(trial):  # not claimed yet
                await self.end(trial, trial.cancel_status or status, message)  # marked above: never None
            else:
                asking.append(trial)
        # The owners are asked in the background: the stop answers once every trial is marked
        # (a cancel not answered is asked again by the sweep).
        self._cancels.ask_all(asking)

    async def finish_if_done(self, experiment_id: str) -> None:
        """A RUNNING experiment that takes no more trials (a limit, its tuner) and has none unfinished is DONE."""
        state = self._store.experiments[experiment_id]
        if state.status != ExperimentStatus.RUNNING:
            return
        limit = state.config.max_trial_number
        submitted = len(self._store.trials_of[experiment_id])
        exhausted = (limit is not None and submitted >= limit) or duration_over(state) or state.no_more_trials
        if exhausted and not self._store.of(experiment_id).unfinished:  # O(1), asked at every trial's end
            await self._store.put_experiment(
                state.model_copy(update={"status": ExperimentStatus.DONE, "end_time": utcnow()})
            )
            log.info("experiment %s is DONE", experiment_id)

    async def publish(self, trial: TrialState, status: TrialStatus) -> None:
        """Put a decision of the dispatcher's own in the trial's history (deduplicated per status and attempt)."""
        event = TrialEvent(
            experiment_id=trial.experiment_id,
            trial_id=trial.id,
            attempt=trial.attempt,
            status=status,
            time=utcnow(),
            message=trial.message,
            platform=trial.platform,
            exit_code=trial.exit_code,
            last_error=trial.last_error,
        )
        await self._bus.js.publish(
            subjects.events(trial.experiment_id, trial.id, subjects.DISPATCHER),
            event.encode(),
            headers={"Nats-Msg-Id": subjects.event_id(trial.id, status.value, trial.attempt)},
        )
