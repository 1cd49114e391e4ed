"""The trial state machine and the operations of the API.

Guarantees:
- an experiment never has more than ``trialConcurrency`` trials dispatched and not ended,
  so the event stream never shows more RUNNING at once;
- a trial is dispatched at most once per attempt (``Nats-Msg-Id: <trial>:<attempt>``);
- every decision is persisted to KV before it is acted on, and every input (API call,
  event, metric) is idempotent, so a restart replays instead of losing or doubling.
All mutations of one experiment run under that experiment's lock. A trial's attempts
(retries, silent trials, a user's retry) are :mod:`.attempts`; what depends on time, the
sweep, is :mod:`.sweep`; events and metric records from the bus are :mod:`.inputs`; the reads
(experiments, pages of trials, a trial's metrics and log) are :mod:`.queries`, answered from
the store's indexes (:mod:`services.common.trial_index`): all are parts of :class:`Dispatcher`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import string
from collections import defaultdict
from collections.abc import Coroutine, Iterable
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from contracts import sealing, subjects
from contracts.base import utcnow
from contracts.experiment import ExperimentConfig, format_validation_error, secret_paths
from contracts.messages import CancelRequest, TrialEvent
from contracts.state import ExperimentState, ExperimentStatus, TrialState, TrialStatus
from services.common.bus import Bus
from services.dispatcher import history, snapshots
from services.dispatcher.attempts import Attempts
from services.dispatcher.errors import ApiError
from services.dispatcher.failfast import FailFast
from services.dispatcher.folds import MetricsProgress
from services.dispatcher.inputs import Inputs
from services.dispatcher.liveness import Liveness
from services.dispatcher.ownership import EventGate
from services.dispatcher.queries import Queries
from services.dispatcher.retention import Retention
from services.dispatcher.settings import DispatcherSettings
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore
from services.dispatcher.sweep import Sweep

log = logging.getLogger(__name__)

_ALNUM = string.ascii_lowercase + string.digits



class Dispatcher(Queries, Inputs, Attempts, Sweep, Retention):
    def __init__(self, settings: DispatcherSettings, bus: Bus, store: StateStore) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        #: trial → loop time of the last cancel request sent to its adapter
        self._cancel_sent: dict[str, float] = {}
        self._asking: set[asyncio.Task] = set()  # a stop's cancel requests, on their way
        #: experiment → parameterId → trial: a submit sent again after its answer was lost is the same trial
        self._by_parameter: dict[str, dict[int | str, str]] = defaultdict(dict)
        #: how far the METRICS stream is applied (a trial's end waits for its metrics)
        self.metrics = MetricsProgress()
        #: which events may change a trial: its owner's only (:mod:`.ownership`)
        self.gate = EventGate()
        #: the experiments' queues and slots, and where their trials go (:mod:`.slots`)
        self.slots = Slots(settings, bus, store)
        #: when each running trial was last heard from, and which were declared lost (:mod:`.liveness`)
        self.liveness = Liveness()
        #: whether each experiment's first trials failed alike (:mod:`.failfast`)
        self.fail_fast = FailFast(self.stop_experiment)

    # ------------------------------------------------------------------ start

    def rebuild(self) -> None:
        """Derive queues and slots from the loaded state.

        Requests of trials dispatched but not yet RUNNING are sent again: a crash may have
        come between the KV write and the publish, and the dedupe id makes a resend of a
        request that did reach the stream a no-op.
        """
        for trial in self.store.trials.values():
            if trial.parameter_id is not None:
                self._by_parameter[trial.experiment_id][trial.parameter_id] = trial.id
            self.slots.load(trial)
            if trial.status == TrialStatus.RUNNING and trial.failure == "lost":  # being stopped for its silence
                self.liveness.declare_lost(trial.id)
            if trial.status.terminal and (state := self.store.experiments.get(trial.experiment_id)):
                self.fail_fast.load(trial, state.config.fail_fast_trials)

    # ------------------------------------------------------------- experiments

    async def create_experiment(self, data: Any) -> ExperimentState:
        if not isinstance(data, dict):
            raise ApiError(400, "the experiment config must be a JSON object (NNI v2 experiment config)")
        try:
            config = ExperimentConfig.model_validate(data)
        except ValidationError as exc:
            raise ApiError(422, format_validation_error(exc)) from None
        if not sealing.installed() and (held := secret_paths(config)):  # never stored in clear
            raise ApiError(422, f"{sealing.NO_KEY} (this experiment's config holds {', '.join(held)})")
        await history.check_platform(self.bus, config, self.settings.check_timeout)
        code_ref = await snapshots.code_ref_for(self.bus, config)
        if code_ref != config.trial_code_ref:
            config = config.model_copy(update={"trial_code_ref": code_ref})
        experiment_id = self._new_id(self.store.experiments, 8, _ALNUM)
        state = ExperimentState(id=experiment_id, config=config, code_ref=code_ref, start_time=utcnow())
        await self.store.put_experiment(state)
        log.info("experiment %s created (%s, concurrency %d)", experiment_id, config.platform, config.trial_concurrency)
        return state

    async def put_code(self, archive: bytes) -> str:
        return await snapshots.put_code(self.bus, archive)

    async def stop_experiment(self, experiment_id: str, message: str | None = None) -> ExperimentState:
        async with self._locks[experiment_id]:
            state = self.experiment(experiment_id)
            if state.status == ExperimentStatus.RUNNING:
                update = {"status": ExperimentStatus.STOPPED, "end_time": utcnow(), "message": message}
                state = state.model_copy(update=update)
                await self.store.put_experiment(state)
                log.info("experiment %s stopped%s", experiment_id, f": {message}" if message else " by the user")
            reason = f"the experiment was stopped: {message}" if message else "the experiment was stopped"
            await self._cancel_all(self.store.unfinished(experiment_id), TrialStatus.USER_CANCELED, reason)
            return state

    async def close_experiment(self, experiment_id: str) -> ExperimentState:
        """The tuner has nothing more to propose: refuse new trials, and be DONE once the submitted ones end."""
        async with self._locks[experiment_id]:
            state = self.experiment(experiment_id)
            if state.status == ExperimentStatus.RUNNING and not state.no_more_trials:
                state = state.model_copy(update={"no_more_trials": True})
                await self.store.put_experiment(state)
                log.info("experiment %s: the tuner has no more trials", experiment_id)
            await self._finish_if_done(experiment_id)
            return self.experiment(experiment_id)

    async def resume_experiment(self, experiment_id: str) -> ExperimentState:
        """NNI's resume: a STOPPED experiment is RUNNING again and takes trials; the tuner service,
        which drives the RUNNING experiments that have a tuner, claims it and adopts its trials.

        ``maxExperimentDuration`` counts the time the experiment ran, not the time it stood
        stopped, as NNI's ``execDuration`` does (:meth:`ExperimentState.run_time`: the time
        stopped is added up in ``stopped_seconds``).
        ``maxTrialNumber`` counts every trial submitted before, the canceled ones too (NNI's
        ``currSubmittedTrialNum``). A RUNNING experiment is answered as it is (a resume sent
        twice is one resume); one with nothing left to run is refused (409) with the reason:
        DONE, its tuner out of trials, or a limit reached.
        """
        async with self._locks[experiment_id]:
            state = self.experiment(experiment_id)
            if state.status == ExperimentStatus.RUNNING:
                return state
            now, trials, duration = utcnow(), state.config.max_trial_number, state.config.max_experiment_duration
            why = None
            if state.no_more_trials:
                why = "its tuner had no more trials to propose"
            elif trials is not None and len(self.store.trials_of[experiment_id]) >= trials:
                why = f"it has run maxTrialNumber ({trials}) trials"
            elif duration is not None and state.run_time(now) >= timedelta(seconds=duration):
                why = f"it has run for its maxExperimentDuration ({duration:g}s)"
            elif state.status == ExperimentStatus.DONE:
                why = "it has ended"
            if why is not None:
                raise ApiError(409, f"experiment {experiment_id} is {state.status.value}: {why}, so a resume would run "
                                    "nothing; create a new experiment to run more trials")
            stopped_for = now - state.end_time if state.end_time else timedelta(0)
            update = {"status": ExperimentStatus.RUNNING, "end_time": None, "message": None,
                      "stopped_seconds": state.stopped_seconds + stopped_for.total_seconds()}  # fmt: skip
            state = state.model_copy(update=update)
            await self.store.put_experiment(state)
            log.info("experiment %s resumed after %.0fs stopped", experiment_id, stopped_for.total_seconds())
            await self.slots.dispatch_ready(experiment_id)
            return state

    # ------------------------------------------------------------------ trials

    async def submit_trial(self, experiment_id: str, parameters: Any, parameter_id: Any = None) -> TrialState:
        if not isinstance(parameters, dict):
            raise ApiError(422, 'parameters must be a JSON object, e.g. {"lr": 0.01}')
        if parameter_id is not None and (isinstance(parameter_id, bool) or not isinstance(parameter_id, int | str)):
            raise ApiError(422, "parameterId must be an integer or a string")
        async with self._locks[experiment_id]:
            state = self.experiment(experiment_id)
            earlier = self._by_parameter[experiment_id].get(parameter_id) if parameter_id is not None else None
            if earlier is not None and (trial := self.store.trials[earlier]).parameters == parameters:
                return trial  # the same submit again (a retry whose first answer was lost): one trial
            config = state.config
            submitted = len(self.store.trials_of[experiment_id])  # trials are never deleted
            if config.max_trial_number is not None and submitted >= config.max_trial_number:
                raise ApiError(
                    409,
                    f"experiment {experiment_id} has reached maxTrialNumber ({config.max_trial_number}); "
                    "raise maxTrialNumber to run more trials",
                )
            if self._duration_over(state):
                raise ApiError(
                    409,
                    f"experiment {experiment_id} has passed maxExperimentDuration "
                    f"({config.max_experiment_duration:g}s)",
                )
            if state.status != ExperimentStatus.RUNNING:
                raise ApiError(409, f"experiment {experiment_id} is {state.status.value}; it takes no more trials")
            if state.no_more_trials:
                raise ApiError(409, f"experiment {experiment_id}'s tuner has no more trials to propose")
            sequence_id = submitted
            trial = TrialState(
                id=self._new_id(self.store.trials, 6, string.ascii_letters + string.digits, first=string.ascii_letters),
                experiment_id=experiment_id,
                sequence_id=sequence_id,
                parameters=parameters,
                parameter_id=sequence_id if parameter_id is None else parameter_id,
                platform="" if config.hybrid else config.adapter,  # hybrid: chosen at dispatch
                submit_time=utcnow(),
                message=f"waiting for a free slot (trialConcurrency {config.trial_concurrency})",
            )
            # One round trip: the trial, the WAITING event and (when a slot is
            # free) the dispatch go out together, after the lock is released. A failure
            # leaves nothing the client was told about; a resend after a crash is deduplicated.
            self.store.defer(trial)
            self._by_parameter[experiment_id][trial.parameter_id] = trial.id
            self.slots.enqueue(trial)
            sends = self.slots.take_ready(experiment_id)
            writes = [
                self._publish_event(trial, TrialStatus.WAITING),
                *(self.slots.send(t) for t in sends),
            ]
            if all(t.id != trial.id for t in sends):
                writes.append(self.store.flush([trial.id]))  # as the cache holds it then
            submitted = self.store.trials[trial.id]  # the answer: WAITING, whatever comes next
        await asyncio.gather(*writes)
        return submitted

    async def cancel_trial(
        self, trial_id: str, status: TrialStatus = TrialStatus.USER_CANCELED, message: str | None = None
    ) -> TrialState:
        trial = self.trial(trial_id)
        async with self._locks[trial.experiment_id]:
            trial = self.store.trials[trial_id]
            if trial.status.terminal:
                raise ApiError(409, f"trial {trial_id} already ended {trial.status.value}")
            return await self._cancel(trial, status, message or "canceled by the user")

    # --------------------------------------------------------------- internals

    def _duration_over(self, state: ExperimentState) -> bool:
        limit = state.config.max_experiment_duration
        return limit is not None and state.run_time(utcnow()) >= timedelta(seconds=limit)

    async def _cancel(self, trial: TrialState, status: TrialStatus, message: str | None) -> TrialState:
        if not trial.dispatched:
            return await self._end(trial, status, message)
        if trial.cancel_status is None:
            trial = trial.model_copy(update={"cancel_status": status, "message": message})
            await self.store.put_trial(trial)
        if trial.status == TrialStatus.WAITING and await self.slots.withdraw(trial):  # not claimed yet
            return await self._end(trial, trial.cancel_status, message)
        await self._request_cancel(trial)
        return self.store.trials[trial.id]

    async def _cancel_all(self, trials: list[TrialState], status: TrialStatus, message: str) -> None:
        """:meth:`_cancel` for many trials (a stopped experiment's unfinished ones): what changes queues
        and slots one trial at a time, the KV writes :data:`AT_ONCE` at a time, and the owners asked
        in the background, as many at a time (one by one and awaited, 1,000 running trials took
        6–10 s to stop). O(trials)."""
        for trial in [t for t in trials if not t.dispatched]:
            await self._end(trial, status, message)
        dispatched = [self.store.trials[t.id] for t in trials if t.dispatched]
        marked = [t.model_copy(update={"cancel_status": status, "message": message})
                  for t in dispatched if t.cancel_status is None]  # fmt: skip
        await _at_most(AT_ONCE, (self.store.put_trial(t) for t in marked))
        asking = []
        for trial in (self.store.trials[t.id] for t in dispatched):
            if trial.status == TrialStatus.WAITING and await self.slots.withdraw(trial):  # not claimed yet
                await self._end(trial, trial.cancel_status, message)
            else:
                asking.append(trial)
        # The owners are asked in the background: the stop answers once every trial is marked
        # (a cancel not answered is asked again by the sweep).
        task = asyncio.create_task(_at_most(AT_ONCE, (self._request_cancel(t) for t in asking)))
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    async def _request_cancel(self, trial: TrialState) -> None:
        """Ask the owning replica to stop the trial; no answer is retried by the sweep."""
        self._cancel_sent[trial.id] = asyncio.get_running_loop().time()
        request = CancelRequest(
            experiment_id=trial.experiment_id,
            trial_id=trial.id,
            status=trial.cancel_status or TrialStatus.USER_CANCELED,
            message=trial.message,
        )
        try:
            await self.bus.nc.request(
                subjects.control(trial.platform, "cancel"), request.encode(), timeout=self.settings.control_timeout
            )
        except Exception:
            log.info("no %s replica answered the cancel of %s yet; will retry", trial.platform, trial.id)

    async def _end(
        self,
        trial: TrialState,
        status: TrialStatus,
        message: str | None,
        *,
        exit_code: int | None = None,
        when=None,
        publish: bool = True,
        sends: list[TrialState] | None = None,
        failure: str | None = None,
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
        self.slots.free(trial)
        self._cancel_sent.pop(trial.id, None)
        self.liveness.forget(trial.id)
        # The slot is free at once (the platform's is: every caller ends a trial that is not
        # running there): the next trial goes out while this end is written. A write-through
        # that fails leaves the cache as it was, and the caller applies the end again; a
        # deferred one stays dirty until written (see StateStore).
        if sends is not None:
            self.store.defer(trial)
            sends += self.slots.take_ready(trial.experiment_id)
        else:
            await asyncio.gather(self.store.put_trial(trial), self.slots.dispatch_ready(trial.experiment_id))
        if publish:  # a decision of the dispatcher's own: put it in the history too
            await self._publish_event(trial, status)
        log.info("trial %s %s%s", trial.id, status.value, f": {message}" if message else "")
        await self._finish_if_done(trial.experiment_id)
        self.fail_fast.ended(trial, self.store.experiments[trial.experiment_id])
        return trial

    async def _finish_if_done(self, experiment_id: str) -> None:
        state = self.store.experiments[experiment_id]
        if state.status != ExperimentStatus.RUNNING:
            return
        limit = state.config.max_trial_number
        submitted = len(self.store.trials_of[experiment_id])
        exhausted = (limit is not None and submitted >= limit) or self._duration_over(state) or state.no_more_trials
        if exhausted and not self.store.of(experiment_id).unfinished:  # O(1), asked at every trial's end
            await self.store.put_experiment(
                state.model_copy(update={"status": ExperimentStatus.DONE, "end_time": utcnow()})
            )
            log.info("experiment %s is DONE", experiment_id)

    async def _publish_event(self, trial: TrialState, status: TrialStatus) -> None:
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
        await self.bus.js.publish(
            subjects.events(trial.experiment_id, trial.id, subjects.DISPATCHER),
            event.encode(),
            headers={"Nats-Msg-Id": subjects.event_id(trial.id, status.value, trial.attempt)},
        )

    @staticmethod
    def _new_id(taken: dict, length: int, alphabet: str, first: str | None = None) -> str:
        while True:
            head = secrets.choice(first or alphabet)
            candidate = head + "".join(secrets.choice(alphabet) for _ in range(length - 1))
            if candidate not in taken:
                return candidate


#: Requests and KV writes a stop sends at once.
AT_ONCE = 64


async def _at_most(limit: int, coros: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Await ``coros``, at most ``limit`` at a time (their errors raised once all are done)."""
    gate = asyncio.Semaphore(limit)

    async def one(coro: Coroutine[Any, Any, Any]) -> None:
        async with gate:
            await coro

    errors = [r for r in await asyncio.gather(*(one(c) for c in coros), return_exceptions=True) if r is not None]
    if errors:
        raise errors[0]
