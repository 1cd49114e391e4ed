"""Experiment and trial state: JetStream KV as the truth, an in-memory index for reads.

The dispatcher is the only writer, so the cache is never stale. Writes come two ways:

- ``put_*``: write through (KV first, then the cache): API calls, whose answer must not
  come before the state is stored.
- ``defer`` then ``flush``: the cache first, KV once per batch (group commit). Events and
  metric records are applied this way, a batch at a time, and acked only after ``flush``
  returned; the experiment lock is then never held across a round trip for them (a submit
  and a dispatch too: their writes go out once the lock is released). A trial
  whose flush failed stays ``dirty`` (the cache is ahead of KV) until a later flush writes
  it: the sweep retries, and a redelivered message flushes its trial before it is acked.

``load`` rebuilds the cache from the buckets at start (``kvwatch``: one ordered consumer per
bucket, not one get per key).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import TypeVar

from nats.js.kv import KeyValue

from contracts.base import Contract, ContractError
from contracts.state import ExperimentState, TrialState
from services.common import kvwatch
from services.common.bus import Bus
from services.common.trial_index import ExperimentTrials, TrialIndex

log = logging.getLogger(__name__)

C = TypeVar("C", bound=Contract)


class StateStore:
    def __init__(self) -> None:
        self.experiments: dict[str, ExperimentState] = {}
        self.trials: dict[str, TrialState] = {}
        #: experiment id → its trial ids in sequence order
        self.trials_of: dict[str, list[str]] = defaultdict(list)
        #: trial id → its cached state that is not (known to be) in KV yet
        self.dirty: dict[str, TrialState] = {}
        #: A write of deferred states failed since the sweep last wrote them all (it then does).
        self.write_failed = False
        self.index = TrialIndex()
        self._experiments_kv: KeyValue | None = None
        self._trials_kv: KeyValue | None = None

    @property
    def _experiments(self) -> KeyValue:
        """The experiments bucket, once loaded."""
        if self._experiments_kv is None:
            raise RuntimeError("the state store is not loaded")
        return self._experiments_kv

    @property
    def _trials(self) -> KeyValue:
        """The trials bucket, once loaded."""
        if self._trials_kv is None:
            raise RuntimeError("the state store is not loaded")
        return self._trials_kv

    async def load(self, bus: Bus) -> None:
        self._experiments_kv = await bus.kv("experiments")
        self._trials_kv = await bus.kv("trials")
        for state in await self._read_all(bus, "experiments", ExperimentState):
            self.experiments[state.id] = state
        for trial in sorted(await self._read_all(bus, "trials", TrialState), key=lambda t: t.sequence_id):
            self._index(trial)
        log.info("loaded %d experiments and %d trials", len(self.experiments), len(self.trials))

    @staticmethod
    async def _read_all(bus: Bus, bucket: str, model: type[C]) -> list[C]:
        states: list[C] = []
        for entry in await kvwatch.current(bus, bucket):
            try:
                states.append(model.decode(entry.value))
            except ContractError as exc:
                log.error("skipping unreadable %s entry %s: %s", model.__name__, entry.key, exc)
        return states

    def _index(self, trial: TrialState) -> None:
        if trial.id not in self.trials:
            self.trials_of[trial.experiment_id].append(trial.id)
        self.trials[trial.id] = trial
        self.of(trial.experiment_id).put(trial)

    def of(self, experiment_id: str) -> ExperimentTrials:
        """The experiment's trial indexes (:mod:`services.common.trial_index`): counts, unfinished trials, pages."""
        if (found := self.index.experiments.get(experiment_id)) is not None:
            return found
        state = self.experiments.get(experiment_id)
        return self.index.of(experiment_id, state is not None and state.config.optimize_mode == "minimize")

    def unfinished(self, experiment_id: str) -> list[TrialState]:
        """The experiment's trials that have not ended, oldest first: O(unfinished)."""
        return [self.trials[t] for t in self.of(experiment_id).unfinished]

    async def put_experiment(self, state: ExperimentState) -> None:
        await self._experiments.put(state.id, state.encode())
        self.experiments[state.id] = state

    async def put_trial(self, trial: TrialState) -> None:
        await self._trials.put(trial.id, trial.encode())
        self._index(trial)
        self.dirty.pop(trial.id, None)  # what was deferred is in KV with this newer state

    def defer(self, trial: TrialState) -> None:
        """Update the cache now; KV gets it with the next ``flush`` of the trial."""
        self._index(trial)
        self.dirty[trial.id] = trial

    async def flush(self, trial_ids: Iterable[str]) -> None:
        """Write the deferred state of these trials (one write each, concurrently).

        Raises the first failure once all writes are settled; the trials that failed stay dirty.
        """
        states = [self.dirty[t] for t in set(trial_ids) if t in self.dirty]
        if not states:
            return
        results = await asyncio.gather(
            *(self._trials.put(state.id, state.encode()) for state in states), return_exceptions=True
        )
        failure = None
        for state, result in zip(states, results, strict=True):
            if isinstance(result, BaseException):
                failure = failure or result
            elif self.dirty.get(state.id) is state:  # not deferred again meanwhile
                del self.dirty[state.id]
        if failure is not None:
            self.write_failed = True
            raise failure

    async def purge(self, experiment_id: str, at_once: int = 256) -> int:
        """Remove the experiment and its trials from KV (purge: watchers see them go) and from
        the cache; how many trials. O(its trials), ``at_once`` writes in flight."""
        trial_ids = list(self.trials_of.get(experiment_id, []))
        for start in range(0, len(trial_ids), at_once):
            await asyncio.gather(*(self._trials.purge(t) for t in trial_ids[start : start + at_once]))
        await self._experiments.purge(experiment_id)
        for trial_id in trial_ids:
            self.trials.pop(trial_id, None)
            self.dirty.pop(trial_id, None)
        self.trials_of.pop(experiment_id, None)
        self.index.experiments.pop(experiment_id, None)
        self.experiments.pop(experiment_id, None)
        return len(trial_ids)

    def trials_for(self, experiment_id: str) -> list[TrialState]:
        return [self.trials[t] for t in self.trials_of.get(experiment_id, [])]
