"""The trial state machine and the operations of the API: :class:`Dispatcher`, a facade over its parts.

Guarantees:
- an experiment never has more than ``trialConcurrency`` trials dispatched and not ended,
  so the event stream never shows more RUNNING at once;
- a trial is dispatched at most once per attempt (``Nats-Msg-Id: <trial>:<attempt>``);
- every decision is persisted to KV before it is acted on, and every input (API call,
  event, metric) is idempotent, so a restart replays instead of losing or doubling.
All mutations of one experiment run under that experiment's lock (one table, handed to every
part that changes state). The parts, each owning its state and built here with what it needs:
queues and slots (:mod:`.slots`), trials' ends and cancels (:mod:`.ends`, :mod:`.cancels`),
attempts (:mod:`.attempts`), submits (:mod:`.submissions`), experiments (:mod:`.experiments`) and their
changes while they run (:mod:`.updates`),
events and metric records from the bus (:mod:`.inputs`), what depends on time (:mod:`.sweep`),
deletes (:mod:`.retention`), the reads (:mod:`.queries`), silent trials (:mod:`.liveness`),
the fail-fast guard (:mod:`.failfast`), the people who may act (:mod:`.people`) and the teams'
shares of the platforms (:mod:`.teams`; the policy is :mod:`.shares`, asked by the slots).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from contracts.messages import TrialEvent
from contracts.people import Caller
from contracts.state import ExperimentState, TrialState, TrialStatus
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher import snapshots
from services.dispatcher.attempts import Attempts
from services.dispatcher.cancels import CancelRequests
from services.dispatcher.ends import Ends
from services.dispatcher.experiments import Experiments
from services.dispatcher.failfast import FailFast
from services.dispatcher.folds import MetricFold
from services.dispatcher.imports import Imports
from services.dispatcher.inputs import Inputs
from services.dispatcher.liveness import Liveness
from services.dispatcher.people import People
from services.dispatcher.queries import PAGE_DEFAULT, Queries, find_trial
from services.dispatcher.retention import Retention
from services.dispatcher.settings import DispatcherSettings
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore
from services.dispatcher.submissions import Submissions
from services.dispatcher.sweep import Sweep
from services.dispatcher.teams import Teams
from services.dispatcher.updates import Updates


class Dispatcher:
    """The dispatcher's state machine (the module's docstring): what the APIs and the service call."""

    def __init__(self, settings: DispatcherSettings, bus: Bus, store: StateStore) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        #: the experiments' queues and slots, and where their trials go (:mod:`.slots`)
        self.slots = Slots(settings, bus, store)
        #: when each running trial was last heard from, and which were declared lost (:mod:`.liveness`)
        self.liveness = Liveness()
        #: whether each experiment's first trials failed alike (:mod:`.failfast`); it stops one as a user does
        self.fail_fast = FailFast(self.stop_experiment)
        self.cancels = CancelRequests(bus, settings.control_timeout)
        self.ends = Ends(
            bus=bus,
            store=store,
            slots=self.slots,
            liveness=self.liveness,
            cancels=self.cancels,
            fail_fast=self.fail_fast,
        )
        self.attempts = Attempts(
            bus=bus,
            store=store,
            slots=self.slots,
            liveness=self.liveness,
            cancels=self.cancels,
            ends=self.ends,
            locks=self._locks,
        )
        self.submissions = Submissions(store=store, slots=self.slots, ends=self.ends, locks=self._locks)
        self.experiments = Experiments(
            bus=bus,
            store=store,
            slots=self.slots,
            ends=self.ends,
            locks=self._locks,
            check_timeout=settings.check_timeout,
        )
        #: changes of a running experiment's limits and search space (:mod:`.updates`)
        self.updates = Updates(store=store, slots=self.slots, ends=self.ends, locks=self._locks)
        self.inputs = Inputs(
            bus=bus,
            store=store,
            slots=self.slots,
            liveness=self.liveness,
            cancels=self.cancels,
            attempts=self.attempts,
            locks=self._locks,
        )
        #: how far the METRICS stream is applied (a trial's end waits for its metrics)
        self.metrics = self.inputs.metrics
        #: which events may change a trial: its owner's only (:mod:`.ownership`)
        self.gate = self.inputs.gate
        self.sweeper = Sweep(
            store=store,
            slots=self.slots,
            cancels=self.cancels,
            ends=self.ends,
            attempts=self.attempts,
            locks=self._locks,
        )
        #: earlier results imported into experiments (:mod:`.imports`)
        self.imports = Imports(bus=bus, store=store, locks=self._locks)
        self.retention = Retention(bus=bus, store=store, locks=self._locks, forget=self._forget)
        self.queries = Queries(bus, store, settings.control_timeout)
        #: users, who is asking, who may act, and the audit trail (:mod:`.people`)
        self.people = People(settings, bus, lambda experiment_id: self.queries.experiment(experiment_id).team)
        #: teams' quotas and weights, their use of the platforms, the queue (:mod:`.teams`, :mod:`.shares`)
        self.teams = Teams(bus, self.people, self.slots.shares, self.slots.placement)

    def rebuild(self) -> None:
        """Derive queues and slots from the loaded state.

        Requests of trials dispatched but not yet RUNNING are sent again: a crash may have
        come between the KV write and the publish, and the dedupe id makes a resend of a
        request that did reach the stream a no-op.
        """
        for trial in self.store.trials.values():
            self.submissions.load(trial)
            self.slots.load(trial)
            if trial.status == TrialStatus.RUNNING and trial.failure == "lost":  # being stopped for its silence
                self.liveness.declare_lost(trial.id)
            if trial.status.terminal and (state := self.store.experiments.get(trial.experiment_id)):
                self.fail_fast.load(trial, state.config.fail_fast_trials)

    def _forget(self, experiment_id: str, trials: list[TrialState]) -> None:
        """A deleted experiment: what the parts hold of it and its trials (:mod:`.retention`)."""
        self.slots.forget(experiment_id, trials)
        for trial in trials:
            self.cancels.forget(trial.id)
        self.submissions.forget(experiment_id)
        self.fail_fast.forget(experiment_id)

    # ------------------------------------------------------------- experiments

    async def create_experiment(self, data: Any, owner: Caller | None = None) -> ExperimentState:
        return await self.experiments.create(data, owner)

    async def put_code(self, archive: bytes) -> str:
        return await snapshots.put_code(self.bus, archive)

    async def stop_experiment(self, experiment_id: str, message: str | None = None) -> ExperimentState:
        return await self.experiments.stop(experiment_id, message)

    async def close_experiment(self, experiment_id: str) -> ExperimentState:
        return await self.experiments.close(experiment_id)

    async def resume_experiment(self, experiment_id: str) -> ExperimentState:
        return await self.experiments.resume(experiment_id)

    async def update_experiment(self, experiment_id: str, data: Any) -> tuple[ExperimentState, dict[str, Any]]:
        return await self.updates.update(experiment_id, data)

    async def delete_experiment(self, experiment_id: str) -> dict[str, Any]:
        deleted = await self.retention.delete(experiment_id)
        await self.imports.drop(experiment_id)
        return deleted

    async def import_results(self, experiment_id: str, rows: Any) -> ExperimentState:
        return await self.imports.add(experiment_id, rows)

    # ------------------------------------------------------------------ trials

    async def submit_trial(self, experiment_id: str, parameters: Any, parameter_id: Any = None) -> TrialState:
        return await self.submissions.submit(experiment_id, parameters, parameter_id)

    async def cancel_trial(
        self, trial_id: str, status: TrialStatus = TrialStatus.USER_CANCELED, message: str | None = None
    ) -> TrialState:
        trial = find_trial(self.store, trial_id)
        async with self._locks[trial.experiment_id]:
            trial = self.store.trials[trial_id]
            if trial.status.terminal:
                raise ApiError(409, f"trial {trial_id} already ended {trial.status.value}")
            return await self.ends.cancel(trial, status, message or "canceled by the user")

    async def retry_trial(self, trial_id: str) -> TrialState:
        return await self.attempts.retry(trial_id)

    # ------------------------------------------------------------------ inputs

    async def on_events(self, events: list[tuple[str, TrialEvent]]) -> set[str]:
        return await self.inputs.on_events(events)

    async def on_metrics(self, records: list[MetricFold], stream_seq: int = 0) -> set[str]:
        return await self.inputs.on_metrics(records, stream_seq)

    async def sweep(self) -> None:
        """Once a second: limits that depend on time, cancels not yet honoured, finished experiments,
        preemptions; the audit records of the second's submits."""
        await self.sweeper.run()
        await self.people.flush()

    # ------------------------------------------------------------------- reads

    def experiment(self, experiment_id: str) -> ExperimentState:
        return self.queries.experiment(experiment_id)

    def experiment_view(self, state: ExperimentState) -> dict[str, Any]:
        return self.queries.experiment_view(state)

    def list_experiments(self) -> list[dict[str, Any]]:
        return self.queries.list_experiments()

    def trial(self, trial_id: str) -> TrialState:
        return self.slots.explained(self.queries.trial(trial_id))

    def list_trials(
        self,
        experiment_id: str,
        limit: int = PAGE_DEFAULT,
        cursor: str | None = None,
        status: str | None = None,
        sort: str = "sequence",
    ) -> dict[str, Any]:
        return self.queries.list_trials(experiment_id, limit, cursor, status, sort)

    async def trial_metrics(self, trial_id: str) -> list[dict[str, Any]]:
        return await self.queries.trial_metrics(trial_id)

    async def trial_log(self, trial_id: str, max_bytes: int = 64 * 1024, attempt: int | None = None) -> str:
        return await self.queries.trial_log(trial_id, max_bytes, attempt)
