"""One experiment driven by its tuner: what NNI's manager loop does, as a client of the bus.

The :class:`Driver` keeps ``trialConcurrency`` trials in flight until ``maxTrialNumber`` trials
were submitted (the dispatcher enforces that limit and ``maxExperimentDuration`` too, answering
409), feeds every intermediate result to the assessor and cancels the trials it prunes as
EARLY_STOPPED, and tells the tuner each trial's end.

What it learns from, all on the bus: the trials' states (the ``trials`` KV bucket, which the
dispatcher writes: parameters, status, the final metric once it is applied) and their
intermediate results (the METRICS stream). Nothing is kept anywhere else, so a restarted tuner
rebuilds the same knowledge: it adopts every trial of the experiment (:meth:`Tuner.adopt`),
replays the experiment's metrics, and only then tells the tuner the ends it saw in the snapshot
and lets the assessor judge (judging half-replayed curves would stop trials too early).

Everything happens in one task, in arrival order, so the tuner is never called concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from contracts import ExperimentState, ExperimentStatus, MetricRecord, MetricType, TrialState, TrialStatus, subjects
from contracts.streams import METRICS
from services.common.api import ApiCallError, call
from services.common.bus import Bus
from services.common.logs import bind
from services.tuner.algorithms import NoMoreTrials, TunerLike
from services.tuner.space import SearchSpaceError

log = logging.getLogger(__name__)

#: Seconds between two tries of a submit the dispatcher could not take (not running, broker away).
RETRY_AFTER = 1.0


@dataclass
class _Trial:
    number: int | None  # the tuner's; None for a trial outside the search space (not modelled)
    status: TrialStatus = TrialStatus.WAITING
    told: bool = False
    early_stop_asked: bool = False
    steps: set[int] = field(default_factory=set)


class Driver:
    """Drives one experiment until :meth:`stop`. Feed it with :meth:`on_trial` and :meth:`on_experiment`."""

    def __init__(self, bus: Bus, state: ExperimentState, tuner: TunerLike, trials: list[TrialState],
                 api_timeout: float = 10.0) -> None:
        self.bus = bus
        self.state = state
        self.tuner = tuner
        self.api_timeout = api_timeout
        self.trials: dict[str, _Trial] = {}
        self.pending: dict[int, dict[str, Any]] = {}  # asked, not yet seen as a trial: number → parameters
        self._unsent: set[int] = set()  # pending numbers whose submit failed: sent again after RETRY_AFTER
        self._ends: list[TrialState] = []  # ends seen before the metrics were replayed, told after
        self.no_more = state.no_more_trials
        self.replayed = False
        self._inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._snapshot = trials
        self._task: asyncio.Task | None = None
        self._metrics_sub: Any = None
        self._retry_at = 0.0

    @property
    def experiment_id(self) -> str:
        return self.state.id

    # ------------------------------------------------------------------ inputs

    def on_trial(self, trial: TrialState) -> None:
        self._inbox.put_nowait(("trial", trial))

    def on_experiment(self, state: ExperimentState) -> None:
        self._inbox.put_nowait(("experiment", state))

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"tuner-{self.experiment_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._metrics_sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._metrics_sub.unsubscribe()

    def done(self) -> BaseException | None:
        """The error that ended the driver, if it ended by one."""
        if self._task is None or not self._task.done() or self._task.cancelled():
            return None
        return self._task.exception()

    # -------------------------------------------------------------------- loop

    async def _run(self) -> None:
        with bind(experiment=self.experiment_id):
            for trial in self._snapshot:
                self._learn(trial)
            await self._replay_then_follow()
            while True:
                await self._step()
                timeout = RETRY_AFTER if self._unsent else None
                try:
                    kind, item = await asyncio.wait_for(self._inbox.get(), timeout)
                except TimeoutError:
                    continue
                self._handle(kind, item)
                while not self._inbox.empty():  # a burst is handled before the next decisions
                    self._handle(*self._inbox.get_nowait())

    def _handle(self, kind: str, item: Any) -> None:
        if kind == "trial":
            self._learn(item)
        elif kind == "metric":
            self._metric(item)
        elif kind == "replayed":
            self._caught_up()
        elif kind == "experiment":
            self.state = item
            self.no_more = self.no_more or item.no_more_trials

    async def _replay_then_follow(self) -> None:
        """Subscribe to the experiment's metrics from the start. Once the records stored when we looked have
        arrived, the history is replayed: the ends seen in the snapshot are told, and the assessor may judge."""
        subject = subjects.metrics(self.experiment_id, "*")
        info = await self.bus.js.stream_info(METRICS.name, subjects_filter=subject)
        remaining = sum((info.state.subjects or {}).values())
        if not remaining:
            self._inbox.put_nowait(("replayed", None))

        async def on_message(msg: Msg) -> None:
            nonlocal remaining
            try:
                self._inbox.put_nowait(("metric", MetricRecord.decode(msg.data)))
            except Exception as exc:  # a record we cannot read is no reason to stop tuning
                log.warning("skipping an unreadable metric record on %s: %s", msg.subject, exc)
            remaining -= 1
            if remaining == 0:
                self._inbox.put_nowait(("replayed", None))

        self._metrics_sub = await self.bus.js.subscribe(subject, stream=METRICS.name, cb=on_message,
                                                        ordered_consumer=True)

    def _learn(self, trial: TrialState) -> None:
        known = self.trials.get(trial.id)
        if known is None:
            if trial.experiment_id != self.experiment_id:
                return
            known = self.trials[trial.id] = _Trial(self._number_for(trial))
        known.status = trial.status
        if trial.status.terminal and self.replayed:
            self._tell(trial.id, known, trial)
        elif trial.status.terminal:
            self._ends.append(trial)

    def _number_for(self, trial: TrialState) -> int | None:
        """Ours (submitted with ``parameterId`` = the tuner's number), or adopted."""
        number = trial.parameter_id
        if isinstance(number, int) and number in self.pending and self.pending[number] == trial.parameters:
            del self.pending[number]
            self._unsent.discard(number)
            return number
        try:
            return self.tuner.adopt(trial.parameters)
        except (SearchSpaceError, ValueError) as exc:
            log.warning("trial %s is not modelled by the tuner (%s)", trial.id, exc)
            return None

    def _metric(self, record: MetricRecord) -> None:
        known = self.trials.get(record.trial_id)
        if known is None or known.number is None or known.told or record.type != MetricType.PERIODICAL:
            return
        if record.sequence in known.steps:  # a record published twice
            return
        known.steps.add(record.sequence)
        try:
            self.tuner.report(known.number, record.sequence, record.decoded())
        except (ValueError, TypeError) as exc:
            log.warning("trial %s: intermediate result %d not used by the assessor: %s",
                        record.trial_id, record.sequence, exc)
            return
        if self.replayed:
            self._judge(record.trial_id, known)

    def _caught_up(self) -> None:
        self.replayed = True
        for trial in self._ends:
            self._tell(trial.id, self.trials[trial.id], trial)
        self._ends.clear()
        for trial_id, known in self.trials.items():
            if known.status == TrialStatus.RUNNING and known.steps:
                self._judge(trial_id, known)
        log.info("resumed from %d trials on the bus", len(self.trials))

    def _tell(self, trial_id: str, known: _Trial, trial: TrialState) -> None:
        if known.told or known.number is None:
            return
        known.told = True
        value = trial.final_metric if trial.status == TrialStatus.SUCCEEDED else None
        try:
            self.tuner.tell(known.number, value)
        except (ValueError, TypeError) as exc:
            log.warning("trial %s: final result %r not used by the tuner: %s", trial_id, value, exc)
            self.tuner.tell(known.number, None)

    def _judge(self, trial_id: str, known: _Trial) -> None:
        if known.status != TrialStatus.RUNNING or known.early_stop_asked or known.number is None:
            return
        if self.tuner.should_prune(known.number):
            known.early_stop_asked = True
            step = max(known.steps)
            message = f"early-stopped by the assessor after intermediate result #{step}"
            log.info("trial %s: %s", trial_id, message)
            asyncio.create_task(self._early_stop(trial_id, message))  # noqa: RUF006 - answers only log

    async def _early_stop(self, trial_id: str, message: str) -> None:
        try:
            await call(self.bus.nc, "trial.cancel",
                       {"id": trial_id, "status": TrialStatus.EARLY_STOPPED.value, "message": message},
                       self.api_timeout)
        except ApiCallError as exc:
            if exc.status != 409:  # 409: it ended meanwhile
                log.warning("could not early-stop trial %s: %s", trial_id, exc.message)

    # ----------------------------------------------------------------- decisions

    def _room(self) -> int:
        """How many trials to submit now: free slots, within maxTrialNumber."""
        if self.state.status != ExperimentStatus.RUNNING or self.no_more or not self.replayed:
            return 0
        config = self.state.config
        in_flight = sum(not t.status.terminal for t in self.trials.values()) + len(self.pending)
        room = config.trial_concurrency - in_flight
        if config.max_trial_number is not None:
            room = min(room, config.max_trial_number - len(self.trials) - len(self.pending))
        return max(room, 0)

    async def _step(self) -> None:
        loop = asyncio.get_running_loop()
        if self.pending and loop.time() >= self._retry_at:  # submits that failed: the same parameters again
            for number in sorted(self._unsent):
                await self._submit(number, self.pending[number])
        for _ in range(self._room()):
            try:
                number, params = self.tuner.ask()
            except NoMoreTrials as exc:
                self.no_more = True
                log.info("%s; the experiment ends when its trials do", exc)
                await self._close()
                return
            self.pending[number] = params
            await self._submit(number, params)

    async def _submit(self, number: int, params: dict[str, Any]) -> None:
        body = {"experimentId": self.experiment_id, "parameters": params, "parameterId": number}
        try:
            await call(self.bus.nc, "trial.submit", body, self.api_timeout)
        except ApiCallError as exc:
            if exc.status == 409:  # maxTrialNumber, maxExperimentDuration or the experiment ended
                log.info("the dispatcher takes no more trials: %s", exc.message)
                self.pending.pop(number, None)
                self._unsent.discard(number)
                self.tuner.tell(number, None)
                self.no_more = True
                return
            log.warning("submitting a trial failed (%s); trying again in %.0fs", exc.message, RETRY_AFTER)
            self._unsent.add(number)
            self._retry_at = asyncio.get_running_loop().time() + RETRY_AFTER
            return
        self._unsent.discard(number)

    async def _close(self) -> None:
        try:
            await call(self.bus.nc, "experiment.close", {"id": self.experiment_id}, self.api_timeout)
        except ApiCallError as exc:
            log.warning("could not tell the dispatcher the tuner has no more trials: %s", exc.message)
