"""One watcher per experiment resolves the futures of every trial a tuner awaits in it.

Tuners await hundreds of trials at once, so there is no subscription and no polling per
trial: the watcher reads ``events.<exp>.>`` and ``metrics.<exp>.>`` from the start of
their streams (ordered consumers), so a trial that ended before anyone asked resolves at
once, and a trial awaited later resolves the moment its record arrives.

Rules:

- A *final* future resolves with the decoded FINAL metric as soon as it arrives, or with
  None once the trial ended without one.
- An *end* future resolves once the trial ended, with a :class:`TrialOutcome`.
- The gateway (metrics) and the adapters (events) publish on different streams, so the two
  subscriptions may deliver out of order. Before it declares a trial ended without a FINAL
  seen, the watcher looks up the stream sequence of the trial's last metric and waits until
  its metrics subscription has delivered it: a FINAL is never missed because it came late.
- An attempt that failed (its event has a failure class) may be retried by the dispatcher as
  the trial's next attempt (``retry:``, docs/retries.md). For those, the watcher asks the
  dispatcher (``confirm``) whether the trial ended or runs again, and keeps waiting in the
  second case. This is the only request it makes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from contracts import MetricType, TrialEvent, TrialState, TrialStatus, subjects
from contracts.base import ContractError, peek
from contracts.metrics import records_of
from contracts.streams import EVENTS, METRICS, stream_name

log = logging.getLogger(__name__)

#: Seconds between questions to the dispatcher while it has not yet decided on a retry.
CONFIRM_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_NO_FINAL = object()


#: The statuses of a trial that has not ended, as events carry them.
_GOING_ON = frozenset(status.value for status in TrialStatus if not status.terminal)


def _status_of(data: bytes) -> str | None:
    """The ``status`` an event's JSON carries, without validating the rest; None if unreadable."""
    return peek(data, "status")


class TrialOutcome(NamedTuple):
    """How a trial ended."""

    status: TrialStatus
    #: The FINAL metric, decoded; None when the trial reported none.
    final: Any
    exit_code: int | None
    message: str | None


@dataclass
class _Trial:
    final: Any = _NO_FINAL
    outcome: TrialOutcome | None = None
    #: The terminal event of the highest attempt seen, and whether a task is handling it.
    end_event: TrialEvent | None = None
    ending: bool = False
    #: (future, wants the final value) of everyone waiting.
    waiters: list[tuple[asyncio.Future[Any], bool]] = field(default_factory=list)


class ExperimentWatcher:
    """``start``, then ``expect`` futures per trial; ``stop`` fails what is still pending."""

    def __init__(
        self, js: JetStreamContext, experiment_id: str, confirm: Callable[[str], Awaitable[TrialState]]
    ) -> None:
        self.experiment_id = experiment_id
        self._js = js
        self._confirm = confirm
        self._trials: dict[str, _Trial] = {}
        self._metrics_seq = 0  # stream sequence of the last metric delivered
        self._barriers: list[tuple[int, asyncio.Future[None]]] = []
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: Exception | None = None

    @property
    def broken(self) -> bool:
        """True once a subscription failed: the client replaces the watcher."""
        return self._error is not None

    async def start(self) -> None:
        for stream, subject, handle in (
            (METRICS.name, subjects.metrics(self.experiment_id, ">"), self._on_metric),
            (EVENTS.name, subjects.experiment_events(self.experiment_id), self._on_event),
        ):
            # A callback per message: nats-py's ``sub.messages`` spends a task and two loop
            # turns on each, and a tuner waiting on trials reads every metric they report.
            sub = await self._js.subscribe(
                subject,
                stream=stream,
                cb=self._callback(handle),
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
            )
            self._subs.append(sub)

    async def stop(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # a closed connection has nothing left to unsubscribe
                log.debug("unsubscribe failed: %s", exc)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail(ConnectionError(f"the watcher of experiment {self.experiment_id} was stopped"))

    def expect(self, trial_id: str, *, final: bool) -> asyncio.Future[Any]:
        """A future for the trial's final value (``final``) or its :class:`TrialOutcome`."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        trial = self._trials.setdefault(trial_id, _Trial())
        if final and trial.final is not _NO_FINAL:
            future.set_result(trial.final)
        elif trial.outcome is not None:
            future.set_result(trial.outcome.final if final else trial.outcome)
        elif self._error is not None:
            future.set_exception(self._error)
        else:
            trial.waiters.append((future, final))
        return future

    def forget(self, trial_id: str, future: asyncio.Future[Any]) -> None:
        """Drop a future nobody awaits any more (after a timeout)."""
        trial = self._trials.get(trial_id)
        if trial is not None:
            trial.waiters = [(f, k) for f, k in trial.waiters if f is not future]

    # -- the two subscriptions ----------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _callback(self, handle: Callable[[Msg], None]) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            if self._error is not None:
                return
            try:
                handle(msg)
            except Exception as exc:  # the watcher is broken: the client starts a new one
                log.error("watching experiment %s failed: %s", self.experiment_id, exc)
                self._fail(ConnectionError(f"watching experiment {self.experiment_id} failed: {exc}"))

        return on_message

    def _on_metric(self, msg: Msg) -> None:
        self._metrics_seq = max(self._metrics_seq, msg.metadata.sequence.stream)
        try:  # one record, or a keeper's batch: only its FINAL matters here
            records = records_of(msg.data, only=MetricType.FINAL)
        except ContractError as exc:
            log.warning("skipping a metric: %s", exc)
            records = []
        for record in records:
            trial = self._trials.setdefault(record.trial_id, _Trial())
            if trial.final is _NO_FINAL:
                try:
                    trial.final = record.decoded()
                except ValueError:
                    trial.final = record.value
                self._resolve(trial)
        still = []
        for seq, barrier in self._barriers:
            if seq <= self._metrics_seq:
                if not barrier.done():
                    barrier.set_result(None)
            else:
                still.append((seq, barrier))
        self._barriers = still

    def _on_event(self, msg: Msg) -> None:
        if _status_of(msg.data) in _GOING_ON:
            return  # only an end matters here: most events are not, and need no validation
        try:
            event = TrialEvent.decode(msg.data)
        except ContractError as exc:
            log.warning("skipping an event: %s", exc)
            return
        if not event.status.terminal:
            return
        trial = self._trials.setdefault(event.trial_id, _Trial())
        if trial.outcome is not None:
            return
        if trial.end_event is None or event.attempt > trial.end_event.attempt:
            trial.end_event = event
        if not trial.ending:
            trial.ending = True
            self._spawn(self._end(trial))

    # -- ending a trial -------------------------------------------------------------------

    async def _end(self, trial: _Trial) -> None:
        while True:
            event = trial.end_event
            assert event is not None
            if event.failure is None or not await self._retried(event):
                break
            if trial.end_event is event:  # runs again: a later event ends it
                trial.ending = False
                return
        if trial.final is _NO_FINAL:  # a FINAL seen already: nothing later can change the outcome
            await self._read_metrics_of(event.trial_id)
        final = None if trial.final is _NO_FINAL else trial.final
        trial.outcome = TrialOutcome(event.status, final, event.exit_code, event.message)
        self._resolve(trial)

    async def _retried(self, event: TrialEvent) -> bool:
        """Ask the dispatcher whether it runs the trial again after this failed attempt."""
        for delay in CONFIRM_DELAYS:
            try:
                state = await self._confirm(event.trial_id)
            except Exception as exc:
                log.warning("cannot ask about trial %s: %s", event.trial_id, exc)
            else:
                if state.attempt > event.attempt:
                    return True
                if state.status.terminal:
                    return False
            await asyncio.sleep(delay)
        return False

    async def _read_metrics_of(self, trial_id: str) -> None:
        """Return once the metrics subscription delivered the trial's last metric so far."""
        try:
            last = await self._js.get_last_msg(stream_name(METRICS), subjects.metrics(self.experiment_id, trial_id))
        except NotFoundError:
            return  # the trial reported no metric at all
        except Exception as exc:
            log.warning("cannot look up the last metric of trial %s (%s); ending it with what arrived", trial_id, exc)
            return
        if last.seq is None or last.seq <= self._metrics_seq:
            return
        barrier: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._barriers.append((last.seq, barrier))
        await barrier

    def _resolve(self, trial: _Trial) -> None:
        keep = []
        for future, wants_final in trial.waiters:
            if future.done():
                continue
            if wants_final and trial.final is not _NO_FINAL:
                future.set_result(trial.final)
            elif trial.outcome is not None:
                future.set_result(trial.outcome.final if wants_final else trial.outcome)
            else:
                keep.append((future, wants_final))
        trial.waiters = keep

    def _fail(self, error: Exception) -> None:
        self._error = error
        for trial in self._trials.values():
            for future, _ in trial.waiters:
                if not future.done():
                    future.set_exception(error)
            trial.waiters = []
        for _, barrier in self._barriers:
            barrier.cancel()
        self._barriers = []
