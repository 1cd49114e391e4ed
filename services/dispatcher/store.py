"""Experiment and trial state: JetStream KV as the truth, an in-memory index for reads.

The dispatcher is the only writer, so the cache is write-through and never stale.
``load`` rebuilds it from the buckets at start (one watch per bucket, not one get per key).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from nats.js.kv import KeyValue

from contracts.base import ContractError
from contracts.state import ExperimentState, TrialState
from services.common.bus import Bus

log = logging.getLogger(__name__)


class StateStore:
    def __init__(self) -> None:
        self.experiments: dict[str, ExperimentState] = {}
        self.trials: dict[str, TrialState] = {}
        #: experiment id → its trial ids in sequence order
        self.trials_of: dict[str, list[str]] = defaultdict(list)
        self._experiments_kv: KeyValue | None = None
        self._trials_kv: KeyValue | None = None

    async def load(self, bus: Bus) -> None:
        self._experiments_kv = await bus.kv("experiments")
        self._trials_kv = await bus.kv("trials")
        for state in await self._read_all(self._experiments_kv, ExperimentState):
            self.experiments[state.id] = state
        for trial in sorted(await self._read_all(self._trials_kv, TrialState), key=lambda t: t.sequence_id):
            self._index(trial)
        log.info("loaded %d experiments and %d trials", len(self.experiments), len(self.trials))

    @staticmethod
    async def _read_all(kv: KeyValue, model: type) -> list:
        states = []
        watcher = await kv.watchall(ignore_deletes=True)
        try:
            async for entry in watcher:
                if entry is None:  # end of the current values
                    break
                try:
                    states.append(model.decode(entry.value))
                except ContractError as exc:
                    log.error("skipping unreadable %s entry %s: %s", model.__name__, entry.key, exc)
        finally:
            await watcher.stop()
        return states

    def _index(self, trial: TrialState) -> None:
        if trial.id not in self.trials:
            self.trials_of[trial.experiment_id].append(trial.id)
        self.trials[trial.id] = trial

    async def put_experiment(self, state: ExperimentState) -> None:
        await self._experiments_kv.put(state.id, state.encode())
        self.experiments[state.id] = state

    async def put_trial(self, trial: TrialState) -> None:
        await self._trials_kv.put(trial.id, trial.encode())
        self._index(trial)

    def stage_trial(self, trial: TrialState) -> None:
        """Update the cache now; the caller persists it with ``flush`` (metric batches)."""
        self._index(trial)

    async def flush(self, trial_ids: set[str]) -> None:
        for trial_id in trial_ids:
            await self._trials_kv.put(trial_id, self.trials[trial_id].encode())

    def trials_for(self, experiment_id: str) -> list[TrialState]:
        return [self.trials[t] for t in self.trials_of.get(experiment_id, [])]
