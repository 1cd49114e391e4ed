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

Memory is bounded by the trials running, not by the experiment: a trial that ended and was told leaves
:attr:`Driver.trials` for one bit (by its sequence id) that keeps a late or repeated change of it from counting
as a new trial; the trials it starts from are read a page at a time.

Everything happens in one task, in arrival order, so the driver never calls the tuner twice at once, but for a
``multiThread`` tuner's proposals (:attr:`~services.tuner.protocol.TunerLike.proposers`): each trial wanted is then a
``propose(1)`` in a task of its own, counted as a trial in flight until it returns, and the driver goes on telling
results and ends meanwhile, as NNI 2.x's dispatcher runs every command on its pool (a proposal that waits for a
result gets it); the tuner's "no more trials" closes the experiment once no proposal is in progress.

Tuner calls run on the driver's daemon threads (:mod:`services.tuner.threads`), off the event loop: a slow tuner
holds up its own experiment only, and one that never returns holds up neither :meth:`Driver.stop` (bounded by
:data:`DRAIN_GRACE` and :data:`CLOSE_GRACE`) nor the process's exit. A user's class that raises stops the experiment
with its traceback as the message (:class:`~services.tuner.protocol.ClassFailed`); a built-in tuner's error ends the
driver, which the service restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from contracts import ExperimentState, ExperimentStatus, MetricRecord, MetricType, TrialState, TrialStatus, subjects
from contracts.metrics import records_of
from contracts.streams import METRICS, stream_name
from services.common.api import ApiError, call
from services.common.bus import Bus
from services.common.logs import bind
from services.common.tasks import cancel_and_wait, first_failure
from services.tuner.imports import Reader
from services.tuner.protocol import ClassFailed, ParameterId, Proposal, TrialEnd, TunerLike
from services.tuner.threads import DaemonPool, spawn
from services.tuner.trials import Ended

log = logging.getLogger(__name__)

#: Seconds between two tries of a submit the dispatcher could not take (not running, broker away).
RETRY_AFTER = 1.0
#: Seconds a tuner gets to close (NNI's ``_on_exit``) before the driver lets it be.
CLOSE_GRACE = 5.0
#: Seconds an ended experiment's driver gets to tell the tuner the ends it has not told yet (the last trial's end
#: and the experiment's can arrive in either order).
DRAIN_GRACE = 5.0


async def stop_experiment(bus: Bus, experiment_id: str, message: str, timeout: float, *, retry: bool) -> None:
    """Stop the experiment with ``message``; with ``retry``, again and again while the dispatcher is away."""
    while True:
        try:
            await call(bus.nc, "experiment.stop", {"id": experiment_id, "message": message}, timeout)
            return
        except ApiError as exc:
            if exc.status == 404 or not retry:  # 404: gone
                log.warning("could not stop experiment %s: %s", experiment_id, exc.message)
                return
            log.warning(
                "could not stop experiment %s (%s); trying again in %.0fs", experiment_id, exc.message, RETRY_AFTER
            )
            await asyncio.sleep(RETRY_AFTER)


@dataclass(slots=True)
class _Trial:
    number: ParameterId | None  # the tuner's; None for a trial it cannot model (outside the search space)
    sequence_id: int
    status: TrialStatus = TrialStatus.WAITING
    told: bool = False
    early_stop_asked: bool = False
    steps: set[int] = field(default_factory=set)


class Driver:
    """Drives one experiment until :meth:`stop`. Feed it with :meth:`on_trial` and :meth:`on_experiment`.

    ``trials`` are the experiment's trials when it starts (read as the driver starts); their changes come through
    :meth:`on_trial`, which may be called (and queue) before.
    """

    def __init__(
        self,
        bus: Bus,
        state: ExperimentState,
        tuner: TunerLike,
        trials: AsyncIterable[TrialState],
        api_timeout: float = 10.0,
        imports: Reader | None = None,
    ) -> None:
        self.bus = bus
        self.state = state
        self.tuner = tuner
        self.api_timeout = api_timeout
        #: The trials not yet ended and told (the others are in :attr:`ended`).
        self.trials: dict[str, _Trial] = {}
        #: The trials that ended and were told (or could not be modelled), by sequence id.
        self.ended = Ended()
        self.pending: dict[ParameterId, dict[str, Any]] = {}  # proposed, not yet seen as a trial
        self._unsent: set[ParameterId] = set()  # pending ids whose submit failed: sent again after RETRY_AFTER
        self._ends: list[TrialEnd] = []  # ends seen before the metrics were replayed, told after
        self._due: list[tuple[ParameterId, TrialEnd]] = []  # ends to tell the tuner, in one batch
        self.no_more = state.no_more_trials
        #: The user's class failed: the experiment is being stopped with this.
        self.failure: ClassFailed | None = None
        self.replayed = False
        self._inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._snapshot: AsyncIterable[TrialState] | None = trials
        self._closing: str | None = None  # why the tuner has no more trials, until the dispatcher is told
        self._ending = False  # the experiment ended: the last ends are told, then the driver returns
        self._task: asyncio.Task | None = None
        self._metrics_sub: Any = None
        self._retry_at = 0.0
        #: ``propose(1)`` calls in progress (a ``multiThread`` tuner's), handled as "proposed" once they return.
        self._proposing: set[asyncio.Task[Proposal]] = set()
        self._read_imports = imports  # the experiment's imported earlier results (services/tuner/imports.py)
        #: How many of them the tuner was given (NNI's import_data): the state's ``imported`` beyond it are new.
        self.imported = 0
        #: The threads tuner calls are made from: one call of the driver's at a time, and its proposals.
        self._threads = DaemonPool(1 + tuner.proposers, "tuner-driver")

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

    async def stop(self, *, ended: bool = False) -> None:
        """Stop driving; ``ended`` when the experiment is over: the tuner then hears of the trials' last ends
        (within :data:`DRAIN_GRACE`) and gets its ``_on_exit``. Not ``ended`` when another replica takes over."""
        if ended and self._task is not None and not self._task.done():
            self._inbox.put_nowait(("ended", None))
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._task), DRAIN_GRACE)
        if self._task is not None:
            await cancel_and_wait([self._task])
        # a proposal still waiting is let be: its thread ends when the tuner returns
        await cancel_and_wait(self._proposing)
        self._threads.shutdown()
        if self._metrics_sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._metrics_sub.unsubscribe()
        # On a thread of its own: the driver's may all be held by calls that do not return.
        closing = asyncio.wrap_future(
            spawn("tuner-close", self.tuner.close, ended=ended, failed=self.failure is not None)
        )
        try:
            await asyncio.wait_for(closing, CLOSE_GRACE)
        except TimeoutError:
            log.warning("experiment %s: the tuner did not close within %.0fs", self.experiment_id, CLOSE_GRACE)
        except Exception as exc:
            log.warning("experiment %s: closing the tuner failed: %r", self.experiment_id, exc)

    def done(self) -> BaseException | None:
        """The error that ended the driver, if it ended by one."""
        return first_failure([self._task]) if self._task is not None else None

    # -------------------------------------------------------------------- loop

    async def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """A tuner call, off the event loop on the driver's threads."""
        return await asyncio.wrap_future(self._threads.submit(method, *args, **kwargs))

    async def _run(self) -> None:
        with bind(experiment=self.experiment_id):
            try:
                await self._drive()
            except ClassFailed as exc:
                self.failure = exc
                log.error("experiment %s: %s", self.experiment_id, exc)
                await stop_experiment(
                    self.bus, self.experiment_id, exc.message("the tuner failed: "), self.api_timeout, retry=True
                )

    async def _drive(self) -> None:
        await self._import()  # before anything else, as NNI's IMPORT_DATA comes before the first request
        if self._snapshot is not None:
            async for trial in self._snapshot:
                await self._learn(trial, resumed=True)
            self._snapshot = None
        await self._replay_then_follow()
        while True:
            await self._tell_due()
            if self._ending and self._settled():
                return
            await self._step()
            timeout = RETRY_AFTER if self._unsent else None
            try:
                kind, item = await asyncio.wait_for(self._inbox.get(), timeout)
            except TimeoutError:
                continue
            await self._handle(kind, item)
            while not self._inbox.empty():  # a burst is handled before the next decisions
                await self._handle(*self._inbox.get_nowait())

    async def _handle(self, kind: str, item: Any) -> None:
        if kind == "trial":
            await self._learn(item, resumed=False)
        elif kind == "metric":
            await self._metric(item)
        elif kind == "replayed":
            await self._caught_up()
        elif kind == "experiment":
            if item.config.search_space is not None and item.config.search_space != self.state.config.search_space:
                await self._new_space(item.config.search_space)
            self.state = item
            self.no_more = self.no_more or item.no_more_trials
            await self._import()  # results imported while it runs: told before the next proposals
        elif kind == "proposed":
            await self._proposed(item)
        elif kind == "ended":
            self._ending = self.no_more = True

    async def _import(self) -> None:
        """Tell the tuner the imported results it has not had yet (the state counts them), in import order."""
        if self._read_imports is None or self.state.imported <= self.imported:
            return
        rows = await self._read_imports()
        new, self.imported = rows[self.imported :], max(self.imported, len(rows))
        if new:
            await self._call(self.tuner.import_data, new)
            log.info("experiment %s: the tuner learnt from %d imported results", self.experiment_id, len(new))

    async def _new_space(self, search_space: dict[str, Any]) -> None:
        """The search space changed (``trialbus update``): the tuner gets it before it proposes again. One it
        cannot search is logged and the old one kept; a user's class that raises stops the experiment."""
        try:
            await self._call(self.tuner.update_search_space, search_space)
        except ValueError as exc:
            log.warning(
                "experiment %s: the new search space is not used, the tuner keeps its own: %s", self.experiment_id, exc
            )
            return
        log.info("experiment %s: the tuner has the new search space (%s)", self.experiment_id, ", ".join(search_space))

    def _settled(self) -> bool:
        """Every trial ended and told (after the experiment did: nothing more for the tuner)."""
        return self.replayed and not self._due and all(t.told for t in self.trials.values())

    async def _replay_then_follow(self) -> None:
        """Subscribe to the experiment's metrics from the start. Once the records stored when we looked have
        arrived, the history is replayed: the ends seen in the snapshot are told, and the assessor may judge."""
        subject = subjects.metrics(self.experiment_id, "*")
        info = await self.bus.js.stream_info(stream_name(METRICS), subjects_filter=subject)
        remaining = sum((info.state.subjects or {}).values())
        if not remaining:
            self._inbox.put_nowait(("replayed", None))

        async def on_message(msg: Msg) -> None:
            nonlocal remaining
            try:
                for record in records_of(msg.data):  # one record, or a keeper's batch of them
                    self._inbox.put_nowait(("metric", record))
            except Exception as exc:  # a record we cannot read is no reason to stop tuning
                log.warning("skipping an unreadable metric record on %s: %s", msg.subject, exc)
            remaining -= 1
            if remaining == 0:
                self._inbox.put_nowait(("replayed", None))

        self._metrics_sub = await self.bus.js.subscribe(
            subject, stream=METRICS.name, cb=on_message, ordered_consumer=True
        )

    async def _learn(self, trial: TrialState, *, resumed: bool) -> None:
        if trial.sequence_id in self.ended or trial.experiment_id != self.experiment_id:
            return  # over: a late or repeated change
        known = self.trials.get(trial.id)
        if known is None:
            known = self.trials[trial.id] = _Trial(await self._number_for(trial, resumed=resumed), trial.sequence_id)
        elif known.status.terminal:
            return  # an older state, read after its end (the pages and the changes overlap)
        known.status = trial.status
        end = TrialEnd(trial.id, trial.status, trial.final_metric)
        if trial.status.terminal and (self.replayed or known.number is None):
            self._end(end, known, trial.sequence_id)
        elif trial.status.terminal:
            self._ends.append(end)

    async def _number_for(self, trial: TrialState, *, resumed: bool) -> ParameterId | None:
        """Ours (submitted with ``parameterId`` = the tuner's id), or adopted: ``resumed`` when it was on the bus
        before this driver started."""
        number = trial.parameter_id
        if number is not None and number in self.pending and self.pending[number] == trial.parameters:
            del self.pending[number]
            self._unsent.discard(number)
            return number
        try:
            return await self._call(self.tuner.adopt, trial.parameters, trial.parameter_id, resumed=resumed)
        except ValueError as exc:  # outside the search space, for a built-in tuner
            log.warning("trial %s is not modelled by the tuner (%s)", trial.id, exc)
            return None

    async def _metric(self, record: MetricRecord) -> None:
        known = self.trials.get(record.trial_id)
        if known is None or known.number is None or known.told or record.type != MetricType.PERIODICAL:
            return
        if record.sequence in known.steps:  # a record published twice
            return
        known.steps.add(record.sequence)
        try:
            value = record.decoded()
            await self._call(self.tuner.report, known.number, record.sequence, value, trial_id=record.trial_id)
        except (ValueError, TypeError) as exc:
            log.warning(
                "trial %s: intermediate result %d not used by the assessor: %s", record.trial_id, record.sequence, exc
            )
            return
        if self.replayed:
            await self._judge(record.trial_id, known)

    async def _caught_up(self) -> None:
        self.replayed = True
        ends, self._ends = self._ends, []
        for end in ends:
            if (known := self.trials.get(end.trial_id)) is not None:
                self._end(end, known, known.sequence_id)
        await self._tell_due()
        for trial_id, known in list(self.trials.items()):
            if known.status == TrialStatus.RUNNING and known.steps:
                await self._judge(trial_id, known)
        log.info("resumed from %d trials on the bus", len(self.trials) + self.ended.count)

    def _end(self, end: TrialEnd, known: _Trial, sequence_id: int) -> None:
        """The trial is over: told to the tuner (with the next batch), and forgotten but for a bit."""
        if known.told:
            return
        known.told = True
        if known.number is not None:
            self._due.append((known.number, end))
        del self.trials[end.trial_id]
        self.ended.add(sequence_id)

    async def _tell_due(self) -> None:
        """The ends seen since the last time, told in one batch (in the order they were seen)."""
        if self._due:
            due, self._due = self._due, []
            await self._call(self.tuner.finish, due)

    async def _judge(self, trial_id: str, known: _Trial) -> None:
        if known.status != TrialStatus.RUNNING or known.early_stop_asked or known.number is None:
            return
        if await self._call(self.tuner.should_prune, known.number, trial_id=trial_id):
            self._stop_early(
                trial_id,
                known,
                f"early-stopped by the {self.tuner.judge} after intermediate result #{max(known.steps)}",
            )

    def _stop_early(self, trial_id: str, known: _Trial | None, message: str) -> None:
        if known is not None:
            if known.status.terminal or known.early_stop_asked:
                return
            known.early_stop_asked = True
        log.info("trial %s: %s", trial_id, message)
        asyncio.create_task(self._early_stop(trial_id, message))  # noqa: RUF006 - answers only log

    async def _early_stop(self, trial_id: str, message: str) -> None:
        try:
            await call(
                self.bus.nc,
                "trial.cancel",
                {"id": trial_id, "status": TrialStatus.EARLY_STOPPED.value, "message": message},
                self.api_timeout,
            )
        except ApiError as exc:
            if exc.status != 409:  # 409: it ended meanwhile
                log.warning("could not early-stop trial %s: %s", trial_id, exc.message)

    # ----------------------------------------------------------------- decisions

    def _room(self) -> int:
        """How many trials to submit now: free slots, within maxTrialNumber."""
        if self.state.status != ExperimentStatus.RUNNING or self.no_more or not self.replayed:
            return 0
        config = self.state.config
        asked = len(self.pending) + len(self._proposing)
        in_flight = sum(not t.status.terminal for t in self.trials.values()) + asked
        room = config.trial_concurrency - in_flight
        if config.max_trial_number is not None:
            room = min(room, config.max_trial_number - len(self.trials) - self.ended.count - asked)
        return max(room, 0)

    async def _step(self) -> None:
        loop = asyncio.get_running_loop()
        if self.pending and loop.time() >= self._retry_at:  # submits that failed: the same parameters again
            for number in sorted(self._unsent, key=str):
                await self._submit(number, self.pending[number])
        room = self._room()
        if room > 0 and self.tuner.proposers:
            for _ in range(min(room, self.tuner.proposers - len(self._proposing))):
                self._propose_one()
        elif room > 0:
            for number, params in self._follow(await self._call(self.tuner.propose, room)):
                self.pending[number] = params
                await self._submit(number, params)
        if self.no_more and self._closing is not None and not self._proposing:
            await self._close(self._closing)

    def _propose_one(self) -> None:
        """One trial asked for in a task of its own (``multiThread``): "proposed" reaches the inbox when it returns."""
        task = asyncio.create_task(self._call(self.tuner.propose, 1), name=f"propose-{self.experiment_id}")
        self._proposing.add(task)
        task.add_done_callback(lambda done: self._inbox.put_nowait(("proposed", done)))

    async def _proposed(self, task: asyncio.Task[Proposal]) -> None:
        """A proposal of :meth:`_propose_one` returned: its trial is submitted (what the tuner raised, raised)."""
        self._proposing.discard(task)
        if task.cancelled():
            return
        for number, params in self._follow(task.result()):
            self.pending[number] = params
            await self._submit(number, params)

    def _follow(self, proposal: Proposal) -> list[tuple[ParameterId, dict[str, Any]]]:
        """Take in what the tuner answered (trials to stop, whether it has more); the trials to submit."""
        for trial_id in proposal.kills:
            self._stop_early(trial_id, self.trials.get(trial_id), f"early-stopped by the {self.tuner.judge}")
        if proposal.no_more is None:
            pass
        elif not proposal.for_now:
            self.no_more, self._closing = True, proposal.no_more
        else:  # an advisor with none now: the experiment closes once nothing runs and it sent nothing more
            in_flight = sum(not t.status.terminal for t in self.trials.values()) + len(self.pending)
            if not in_flight and not proposal.trials:
                self.no_more, self._closing = True, proposal.no_more
        return proposal.trials

    async def _submit(self, number: ParameterId, params: dict[str, Any]) -> None:
        body = {"experimentId": self.experiment_id, "parameters": params, "parameterId": number}
        try:
            await call(self.bus.nc, "trial.submit", body, self.api_timeout)
        except ApiError as exc:
            if exc.status == 409:  # maxTrialNumber, maxExperimentDuration or the experiment ended
                log.info("the dispatcher takes no more trials: %s", exc.message)
                self.pending.pop(number, None)
                self._unsent.discard(number)
                await self._call(self.tuner.forget, number)
                self.no_more = True
                return
            log.warning("submitting a trial failed (%s); trying again in %.0fs", exc.message, RETRY_AFTER)
            self._unsent.add(number)
            self._retry_at = asyncio.get_running_loop().time() + RETRY_AFTER
            return
        self._unsent.discard(number)

    async def _close(self, reason: str) -> None:
        self._closing = None
        log.info("%s; the experiment ends when its trials do", reason)
        try:
            await call(self.bus.nc, "experiment.close", {"id": self.experiment_id}, self.api_timeout)
        except ApiError as exc:
            log.warning("could not tell the dispatcher the tuner has no more trials: %s", exc.message)
