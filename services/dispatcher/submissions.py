"""Taking a trial: a tuner's (or a user's) submit, checked against the experiment's limits,
queued in submission order, and the same submit sent again answered with the same trial.

A submit names the tuner's ``parameterId`` (NNI's); a submit sent again after its answer was
lost (same experiment, ``parameterId`` and parameters) is the trial the first one made. The
trial, its WAITING event and (when a slot is free) its dispatch go out together, after the
experiment's lock is released. O(1) per submit; memory is one entry per trial.
"""

from __future__ import annotations

import asyncio
import string
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from contracts.base import utcnow
from contracts.state import ExperimentStatus, TrialState, TrialStatus
from services.common.api import ApiError
from services.dispatcher.ends import Ends, duration_over
from services.dispatcher.ids import TRIAL_ALPHABET, new_id
from services.dispatcher.queries import find_experiment
from services.dispatcher.slots import Slots
from services.dispatcher.store import StateStore


class Submissions:
    """The trials submitted to each experiment (the module's docstring); ``locks``: experiment → its lock."""

    def __init__(self, *, store: StateStore, slots: Slots, ends: Ends, locks: Mapping[str, asyncio.Lock]) -> None:
        self._store = store
        self._slots = slots
        self._ends = ends
        self._locks = locks
        #: experiment → parameterId → trial: a submit sent again after its answer was lost is the same trial
        self._by_parameter: dict[str, dict[int | str, str]] = defaultdict(dict)

    def load(self, trial: TrialState) -> None:
        """A trial of the state loaded at start: a submit of its parameterId again is the same trial."""
        if trial.parameter_id is not None:
            self._by_parameter[trial.experiment_id][trial.parameter_id] = trial.id

    def forget(self, experiment_id: str) -> None:
        """The experiment is deleted."""
        self._by_parameter.pop(experiment_id, None)

    async def submit(self, experiment_id: str, parameters: Any, parameter_id: Any = None) -> TrialState:
        """A new trial, WAITING (or the one an earlier identical submit made); 409 past the experiment's limits."""
        if not isinstance(parameters, dict):
            raise ApiError(422, 'parameters must be a JSON object, e.g. {"lr": 0.01}')
        if parameter_id is not None and (isinstance(parameter_id, bool) or not isinstance(parameter_id, int | str)):
            raise ApiError(422, "parameterId must be an integer or a string")
        async with self._locks[experiment_id]:
            state = find_experiment(self._store, experiment_id)
            earlier = self._by_parameter[experiment_id].get(parameter_id) if parameter_id is not None else None
            if earlier is not None and (trial := self._store.trials[earlier]).parameters == parameters:
                return trial  # the same submit again (a retry whose first answer was lost): one trial
            config = state.config
            submitted = len(self._store.trials_of[experiment_id])  # trials are never deleted
            if config.max_trial_number is not None and submitted >= config.max_trial_number:
                raise ApiError(
                    409,
                    f"experiment {experiment_id} has reached maxTrialNumber ({config.max_trial_number}); "
                    "raise maxTrialNumber to run more trials",
                )
            if duration_over(state):
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
            # A trial a person adds to an experiment the tuner service drives (it always names its own
            # parameterId) is NNI's customized trial: no parameter id, as NNI's manager packs one.
            customized = parameter_id is None and bool(config.tuner or config.advisor)
            key: int | str | None = None if customized else sequence_id if parameter_id is None else parameter_id
            trial = TrialState(
                id=new_id(self._store.trials, 6, TRIAL_ALPHABET, first=string.ascii_letters),
                experiment_id=experiment_id,
                sequence_id=sequence_id,
                parameters=parameters,
                parameter_id=key,
                platform="" if config.hybrid else config.adapter,  # hybrid: chosen at dispatch
                submit_time=utcnow(),
                message=f"waiting for a free slot (trialConcurrency {config.trial_concurrency})",
                owner=state.owner,
                team=state.team,
            )
            # One round trip: the trial, the WAITING event and (when a slot is
            # free) the dispatch go out together, after the lock is released. A failure
            # leaves nothing the client was told about; a resend after a crash is deduplicated.
            self._store.defer(trial)
            if key is not None:
                self._by_parameter[experiment_id][key] = trial.id
            self._slots.enqueue(trial)
            sends = self._slots.take_ready(experiment_id)
            writes = [
                self._ends.publish(trial, TrialStatus.WAITING),
                *(self._slots.send(t) for t in sends),
            ]
            if all(t.id != trial.id for t in sends):
                writes.append(self._store.flush([trial.id]))  # as the cache holds it then
            answer = self._store.trials[trial.id]  # WAITING, whatever comes next
        await asyncio.gather(*writes)
        return answer
