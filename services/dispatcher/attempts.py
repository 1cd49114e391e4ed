"""A trial's attempts as the dispatcher runs them: an attempt that ended runs again or ends
the trial (the policy is :mod:`.retries`), a silent attempt is stopped (:mod:`.liveness`),
a copy of an attempt that must not run is stopped, and a user's retry of a trial that has
ended. Every method but :meth:`Attempts.retry` runs under the experiment's lock (its caller
holds it); each costs O(attempts of the trial).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from contracts import subjects
from contracts.base import utcnow
from contracts.messages import CancelRequest, TrialEvent
from contracts.retries import Failure
from contracts.state import ExperimentStatus, TrialState, TrialStatus
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher import retries
from services.dispatcher.cancels import CancelRequests
from services.dispatcher.ends import Ends
from services.dispatcher.liveness import Liveness
from services.dispatcher.queries import find_experiment, find_trial
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)


class Attempts:
    """A trial's attempts (the module's docstring); ``locks``: experiment → its lock."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: StateStore,
        slots: Slots,
        liveness: Liveness,
        cancels: CancelRequests,
        ends: Ends,
        locks: Mapping[str, asyncio.Lock],
    ) -> None:
        self._bus = bus
        self._store = store
        self._slots = slots
        self._liveness = liveness
        self._cancels = cancels
        self._ends = ends
        self._locks = locks

    async def ended(
        self,
        trial: TrialState,
        status: TrialStatus,
        failure: Failure | None,
        message: str | None,
        *,
        sends: list[TrialState] | None = None,
        exit_code: int | None = None,
        when=None,
        publish: bool,
        last_error: str | None = None,
    ) -> None:
        """The trial's current attempt ended so: run it again if the retry policy says so, else end it
        (with its last stderr line, ``last_error``)."""
        state = self._store.experiments[trial.experiment_id]
        retry = retries.decide(
            trial,
            status,
            failure,
            state.config.retry_policy,
            when=when or utcnow(),
            exit_code=exit_code,
            message=message,
            hybrid=state.config.hybrid,
        )
        if retry is not None and state.status == ExperimentStatus.RUNNING:
            await self.again(trial, retry.trial, sends)
        else:
            await self._ends.end(
                trial,
                status,
                message,
                exit_code=exit_code,
                when=when,
                publish=publish,
                sends=sends,
                failure=failure,
                last_error=last_error,
            )

    async def silence(self, trial: TrialState, timeout: float) -> None:
        """Sweep: a running trial silent past ``timeout`` is stopped, to run again once it ended;
        if its end does not come within ``timeout`` more (its adapter is gone too), it is given up."""
        if trial.id in self._liveness.lost:
            if self._liveness.given_up(trial.id, timeout):
                why = f"{trial.message}; its adapter did not confirm the stop within {timeout:g}s"
                await self.ended(trial, TrialStatus.FAILED, "lost", why, publish=True)
            return
        if not self._liveness.silent(trial, timeout):
            return
        self._liveness.declare_lost(trial.id)
        message = (
            f"no sign of life from its keeper for {timeout:g}s (retry.heartbeatTimeout): stopping attempt "
            f"{trial.attempt} to run it again"
        )
        trial = trial.model_copy(update={"message": message, "failure": "lost"})  # kept across a restart
        await self._store.put_trial(trial)
        log.warning("trial %s: %s", trial.id, message)
        await self._stop(trial, message)  # (unanswered: the sweep gives it up after the timeout all the same)

    async def preempt(self, trial: TrialState, why: str) -> None:
        """Preempt a running trial for another's turn (:mod:`.shares`): its owner stops it as a drain does
        (SIGTERM, its grace period to save a checkpoint), it ends SYS_CANCELED with failure ``preempted``,
        and runs again as its next attempt, from its checkpoint, without counting against ``retry:``."""
        if trial.status != TrialStatus.RUNNING or trial.cancel_status:
            return
        self._store.defer(trial.model_copy(update={"message": why}))
        log.info("trial %s: %s", trial.id, why)
        await self._stop(trial, why, preempt=True)  # (unanswered: still counted as being preempted till it ends)

    async def _stop(self, trial: TrialState, message: str, preempt: bool = False) -> None:
        """Ask the replica that runs the trial's current attempt to stop it (SYS_CANCELED, or a preemption)."""
        stop = CancelRequest(
            experiment_id=trial.experiment_id,
            trial_id=trial.id,
            status=TrialStatus.SYS_CANCELED,
            message=message,
            preempt=preempt,
            attempt=trial.attempt,
            replica=trial.replica,
        )
        try:
            await self._bus.nc.publish(subjects.control(trial.platform, "cancel"), stop.encode())
        except Exception as exc:
            log.warning("cannot ask %s to stop trial %s: %s", trial.platform, trial.id, exc)

    async def again(self, ended: TrialState, trial: TrialState, sends: list[TrialState] | None = None) -> None:
        """Run ``trial`` (``ended``'s next attempt, from :mod:`.retries`) again: its slot is
        free meanwhile; it goes first in the queue once its back-off is over."""
        self._slots.free(ended)
        self._cancels.forget(trial.id)
        self._liveness.forget(trial.id)
        self._slots.again(trial)
        self._store.defer(trial)
        log.info("trial %s: %s", trial.id, trial.message)
        await self._ends.publish(trial, TrialStatus.WAITING)  # the history says why it runs again
        if sends is not None:
            sends += self._slots.take_ready(trial.experiment_id)
        else:
            await asyncio.gather(self._store.flush([trial.id]), self._slots.dispatch_ready(trial.experiment_id))

    @staticmethod
    def another_copy(trial: TrialState, event: TrialEvent) -> bool:
        """Whether ``event`` (of the trial's current attempt) comes from a replica other than the one that
        started the attempt: a second copy (its request redelivered to another replica), fenced off."""
        return bool(
            trial.replica
            and event.replica
            and event.replica != trial.replica
            and event.status != TrialStatus.WAITING
            and event.platform == trial.platform
        )

    async def stop_copy(self, subject: str, event: TrialEvent, why: str) -> None:
        """Stop the copy of an attempt that must not run (an older attempt, or a second copy of the current
        one): only that replica's, only that attempt. Its later events are ignored."""
        adapter = subjects.source_from_subject(subject) or event.platform
        if not adapter or adapter == subjects.DISPATCHER or not event.replica:
            return
        log.warning("trial %s: stopping replica %s's copy: %s", event.trial_id, event.replica, why)
        stop = CancelRequest(
            experiment_id=event.experiment_id,
            trial_id=event.trial_id,
            status=TrialStatus.SYS_CANCELED,
            message=f"stopped: {why}",
            attempt=event.attempt,
            replica=event.replica,
        )
        try:
            await self._bus.nc.publish(subjects.control(adapter, "cancel"), stop.encode())
        except Exception as exc:  # its next RUNNING event (an adoption, a note) asks again
            log.warning("cannot stop trial %s's copy on replica %s: %s", event.trial_id, event.replica, exc)

    async def retry(self, trial_id: str) -> TrialState:
        """A new attempt of a trial that has ended (``trialbus trial retry``): same id and parameters."""
        trial = find_trial(self._store, trial_id)
        async with self._locks[trial.experiment_id]:
            trial, state = self._store.trials[trial_id], find_experiment(self._store, trial.experiment_id)
            if not trial.status.terminal:
                raise ApiError(
                    409,
                    f"trial {trial_id} is {trial.status.value}: only a trial that has ended can be "
                    "retried (cancel it first to start it over)",
                )
            if state.status != ExperimentStatus.RUNNING:
                raise ApiError(
                    409,
                    f"experiment {state.id} is {state.status.value}; it runs no trials, so a retry "
                    "would never start (resume the experiment first, if it can be)",
                )
            again = retries.manual(trial, hybrid=state.config.hybrid, when=utcnow())
            await self.again(trial, again)
            return self._store.trials[trial_id]
