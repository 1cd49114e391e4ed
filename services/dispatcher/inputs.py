"""The dispatcher's bus inputs: adapters' trial events and the keepers' metric records,
applied a batch at a time. Owns which events may change a trial (:mod:`.ownership`) and how
far the METRICS stream is applied (:class:`~services.dispatcher.folds.MetricsProgress`); an end
goes to the trial's attempts (:mod:`.attempts`). Each input is idempotent (a replay or a
duplicate changes nothing) and costs O(1) per event or record: only its trial is read.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from contracts.messages import TrialEvent
from contracts.state import TrialState, TrialStatus
from services.common.bus import Bus
from services.common.logs import bind
from services.dispatcher.attempts import Attempts
from services.dispatcher.cancels import CancelRequests
from services.dispatcher.folds import MetricFold, MetricsProgress
from services.dispatcher.liveness import Liveness
from services.dispatcher.ownership import EventGate
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)


class Inputs:
    """The bus inputs of the dispatcher (the module's docstring); ``locks``: experiment → its lock."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: StateStore,
        slots: Slots,
        liveness: Liveness,
        cancels: CancelRequests,
        attempts: Attempts,
        locks: Mapping[str, asyncio.Lock],
    ) -> None:
        self._bus = bus
        self._store = store
        self._slots = slots
        self._liveness = liveness
        self._cancels = cancels
        self._attempts = attempts
        self._locks = locks
        #: how far the METRICS stream is applied (a trial's end waits for its metrics)
        self.metrics = MetricsProgress()
        #: which events may change a trial: its owner's only (:mod:`.ownership`)
        self.gate = EventGate()

    async def on_events(self, events: list[tuple[str, TrialEvent]]) -> set[str]:
        """Apply a batch of adapters' events, each with the subject it came on; the trials whose
        state is left to write (``store.flush``, then ack: the service writes them a little
        later, with its next batches, :class:`~services.dispatcher.consumer.GroupCommit`).

        Idempotent: replays and duplicates change nothing. An event from anyone but its
        trial's adapter (or the dispatcher) is refused (:mod:`.ownership`). Ends are written
        before this returns (one write per trial, however many of its events the batch holds),
        together with the requests of the trials that took the freed slots: readers of the
        ``trials`` bucket (the tuner service, the web UI) act on ends. A RUNNING waits for the
        group commit, so a trial that ends within it is written once, start and end together.
        """
        sends: list[TrialState] = []
        for subject, event in events:
            await self.on_event(subject, event, sends)
        changed = {event.trial_id for _, event in events}
        dirty = self._store.dirty
        ended = [t for t in changed if t in dirty and dirty[t].status.terminal]
        await asyncio.gather(self._store.flush(ended), *(self._slots.send(t) for t in sends))
        return changed

    async def on_event(self, subject: str, event: TrialEvent, sends: list[TrialState]) -> None:
        """Apply one event to the cache. Its trial's state is left for :meth:`on_events` to
        flush, and the trials that take a slot it freed are added to ``sends``: no round trip
        happens under the experiment lock."""
        trial = self._store.trials.get(event.trial_id)
        if trial is not None and event.attempt != trial.attempt:  # an attempt that is over: nothing to apply
            if event.attempt < trial.attempt and event.status == TrialStatus.RUNNING:
                why = f"attempt {event.attempt} runs, but the trial is at attempt {trial.attempt}"
                await self._attempts.stop_copy(subject, event, why)
            return
        if not self.gate.admits(subject, event, trial.platform if trial else None):
            return
        if trial is None:
            return
        if self._attempts.another_copy(trial, event):
            if event.status == TrialStatus.RUNNING:
                why = f"a second copy of attempt {event.attempt}, which runs on replica {trial.replica}"
                await self._attempts.stop_copy(subject, event, why)
            return
        if event.status == TrialStatus.WAITING:  # an adapter says what the dispatched trial waits for
            if event.platform and trial.status == TrialStatus.WAITING and trial.message != event.message:
                self._store.defer(trial.model_copy(update={"message": event.message}))
            return
        if event.status.terminal and not trial.status.terminal and trial.final_metric is None:
            await self.metrics.caught_up(self._bus.js)  # with the FINAL applied, its earlier records are too
        async with self._locks[trial.experiment_id]:
            trial = self._store.trials[event.trial_id]
            with bind(experiment=trial.experiment_id, trial=trial.id):
                if trial.status.terminal:
                    if event.status == TrialStatus.RUNNING and trial.cancel_status:
                        await self._cancels.ask(trial)  # it started after we ended it: stop it
                    return
                if event.status == TrialStatus.RUNNING:
                    if trial.status == TrialStatus.WAITING:
                        update = {"status": TrialStatus.RUNNING, "start_time": event.time, "replica": event.replica}
                        self._store.defer(trial := trial.model_copy(update={**update, "message": None}))
                    elif event.message != trial.message and not trial.cancel_status:  # a note: status stale
                        self._store.defer(trial := trial.model_copy(update={"message": event.message}))
                    if trial.cancel_status:
                        await self._cancels.ask(trial)
                    return
                if trial.id in self._liveness.lost:  # the end of an attempt we stopped for its silence
                    await self._attempts.ended(
                        trial,
                        TrialStatus.FAILED,
                        "lost",
                        trial.message,
                        sends=sends,
                        exit_code=event.exit_code,
                        when=event.time,
                        publish=True,
                    )
                    return
                failure = event.failure or (None if event.status != TrialStatus.FAILED else "trial")
                await self._attempts.ended(
                    trial,
                    event.status,
                    failure,
                    event.message,
                    sends=sends,
                    exit_code=event.exit_code,
                    when=event.time,
                    publish=False,
                    last_error=event.last_error,
                )

    async def on_metrics(self, records: list[MetricFold], stream_seq: int = 0) -> set[str]:
        """Fold a batch of metric records into trial state (final metric, intermediate count) in
        the cache; the trials left to write (``store.flush``, then ack: the service writes them
        a little later, with its next batches, :class:`~services.dispatcher.consumer.GroupCommit`;
        a trial that ends meanwhile is written once, with its end).

        Each record is folded into its trial's :class:`MetricFold` first, so a batch costs
        one state copy and at most one KV write per trial, not per record (records arrive by
        the thousand). ``stream_seq`` is the METRICS sequence of the batch's last record: once
        applied, terminal events waiting in ``metrics.caught_up`` may proceed.
        """
        by_experiment: dict[str, list[MetricFold]] = defaultdict(list)
        for fold in records:
            if fold.trial_id in self._store.trials:
                by_experiment[fold.experiment_id].append(fold)
        for experiment_id, folds in by_experiment.items():
            async with self._locks[experiment_id]:  # no lost update against an event
                for fold in folds:
                    trial = self._store.trials[fold.trial_id]
                    if fold.attempt != trial.attempt:  # an attempt that is over (a retry runs): history only
                        continue
                    self._liveness.heard(trial.id)
                    update: dict[str, Any] = {"intermediate_count": max(trial.intermediate_count, fold.periodical)}
                    if fold.final is not None:
                        try:
                            update["final_metric"] = json.loads(fold.final)
                        except ValueError:
                            update["final_metric"] = fold.final
                    self._store.defer(trial.model_copy(update=update))
        self.metrics.applied(stream_seq)  # in the cache: an end waiting for them may go on
        return {fold.trial_id for folds in by_experiment.values() for fold in folds}
