"""The trials an Optuna tuner learns from, bounded: an Optuna storage for one study in memory.

Optuna's ``InMemoryStorage`` keeps every trial of a study for ever, and its samplers and pruners read all of them
at each call: TPE builds its model from every finished trial at each ``suggest``, Hyperband and the percentile
pruners rank a trial's intermediate result among every trial's at the same step. So a study's memory grows with
its trials and so does the cost of each ask and each judgement (TPE took 80 ms an ask at 5,000 trials and grows
on; Hyperband's judgements made 100,000 trials quadratic).

:class:`History` keeps, and shows samplers and pruners, only:

* the unfinished trials (WAITING, RUNNING): as many as the experiment runs at once;
* the last ``keep_last`` finished trials (COMPLETE, PRUNED, FAIL), in the order they finished;
* the ``keep_best`` best COMPLETE trials (the study's best among them, which ``best_trial`` answers).

Every other trial is forgotten: its number is never reused, ``study.trials`` lists the kept ones in number order.
``keep_best`` defaults to 25, TPE's largest "good" group (``default_gamma`` caps it at 25), so TPE's model of the
good region is the one it would build from all trials, and only the "bad" side sees a window of the last ones;
TPE already weighs old trials down, so it loses little. Pruners rank among the window, which follows the
search as it moves. While fewer trials than the bound have finished, nothing is forgotten and a seeded sampler
proposes exactly what it does over Optuna's own storage.

Memory: ``keep_last + keep_best`` finished trials plus the running ones, a few KiB each (parameters,
intermediate results, attributes). Every call is O(1) except ``get_all_trials``, O(kept trials).
"""

from __future__ import annotations

import copy
import heapq
import threading
import uuid
from collections import OrderedDict
from collections.abc import Container, Sequence
from datetime import datetime
from typing import Any

from optuna.distributions import BaseDistribution, check_distribution_compatibility
from optuna.storages import BaseStorage
from optuna.storages._base import DEFAULT_STUDY_NAME_PREFIX
from optuna.study import StudyDirection
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial, TrialState

__all__ = ["DEFAULT_KEEP_BEST", "DEFAULT_KEEP_LAST", "History"]

#: Finished trials kept by default (``TRIALBUS_TUNER_HISTORY``).
DEFAULT_KEEP_LAST = 1000
#: Best completed trials kept besides them.
DEFAULT_KEEP_BEST = 25

_STUDY_ID = 0


class History(BaseStorage):
    """An Optuna storage of one study that forgets finished trials beyond ``keep_last`` (and the ``keep_best``
    best); ``keep_last=None`` forgets nothing. A trial's id is its number."""

    def __init__(self, keep_last: int | None = DEFAULT_KEEP_LAST, keep_best: int = DEFAULT_KEEP_BEST) -> None:
        if keep_last is not None and keep_last < 1 or keep_best < 1:
            raise ValueError(f"a history keeps at least one trial, got keep_last={keep_last}, keep_best={keep_best}")
        self.keep_last, self.keep_best = keep_last, keep_best
        self._lock = threading.RLock()
        self._name: str | None = None
        self._directions: list[StudyDirection] = []
        self._user_attrs: dict[str, Any] = {}
        self._system_attrs: dict[str, Any] = {}
        self._distributions: dict[str, BaseDistribution] = {}
        self._created = 0  # trials ever created: the next number
        self._trials: dict[int, FrozenTrial] = {}  # kept, by number; insertion order is number order
        self._waiting: dict[int, None] = {}  # WAITING (enqueued) trials, oldest first
        self._window: OrderedDict[int, None] = OrderedDict()  # the last finished, oldest first
        self._best: list[tuple[float, int, int]] = []  # heap of the best completed: (score, -number, number)
        self._best_numbers: set[int] = set()
        self._best_id: int | None = None

    # ------------------------------------------------------------------ what is kept

    def __len__(self) -> int:
        """How many trials are kept now."""
        return len(self._trials)

    @property
    def created(self) -> int:
        """How many trials the study ever had."""
        return self._created

    def _finished(self, trial: FrozenTrial) -> None:
        if self.keep_last is not None:
            self._window[trial.number] = None
        if trial.state == TrialState.COMPLETE and trial.value is not None:
            self._rank(trial, trial.value)
        while self.keep_last is not None and len(self._window) > self.keep_last:
            old, _ = self._window.popitem(last=False)
            if old not in self._best_numbers:
                self._trials.pop(old, None)

    def _rank(self, trial: FrozenTrial, value: float) -> None:
        maximize = self._directions[0] == StudyDirection.MAXIMIZE
        value = float(value)
        best = None if self._best_id is None else self._trials[self._best_id].value  # ranked: it has a value
        if best is None or (value > best if maximize else value < best):
            self._best_id = trial.number  # the first to reach the best value, as Optuna answers
        # The heap's top is the worst of the best; among equal values the later trial goes first.
        heapq.heappush(self._best, (value if maximize else -value, -trial.number, trial.number))
        self._best_numbers.add(trial.number)
        if len(self._best) > self.keep_best:
            _, _, out = heapq.heappop(self._best)
            self._best_numbers.discard(out)
            if out not in self._window and self.keep_last is not None:
                self._trials.pop(out, None)

    # ------------------------------------------------------------------ the study

    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        with self._lock:
            if self._name is not None:
                raise RuntimeError("a History holds one study")
            self._name = study_name or f"{DEFAULT_STUDY_NAME_PREFIX}{uuid.uuid4()}"  # as Optuna names one
            self._directions = list(directions)
            return _STUDY_ID

    def delete_study(self, study_id: int) -> None:
        raise NotImplementedError("a tuner's study lives as long as its tuner")

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        with self._lock:
            self._user_attrs = {**self._user_attrs, key: value}

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        with self._lock:
            self._system_attrs = {**self._system_attrs, key: value}

    def get_study_id_from_name(self, study_name: str) -> int:
        if study_name != self._name:
            raise KeyError(f"No such study {study_name}.")
        return _STUDY_ID

    def get_study_name_from_id(self, study_id: int) -> str:
        assert self._name is not None
        return self._name

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._directions

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._user_attrs

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._system_attrs

    def get_all_studies(self) -> list[FrozenStudy]:
        if self._name is None:
            return []
        return [
            FrozenStudy(
                study_name=self._name,
                direction=None,
                directions=self._directions,
                user_attrs=copy.deepcopy(self._user_attrs),
                system_attrs=copy.deepcopy(self._system_attrs),
                study_id=_STUDY_ID,
            )
        ]

    # ------------------------------------------------------------------ trials

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        with self._lock:
            if template_trial is None:
                trial = FrozenTrial(
                    trial_id=-1,
                    number=-1,
                    state=TrialState.RUNNING,
                    params={},
                    distributions={},
                    user_attrs={},
                    system_attrs={},
                    value=None,
                    intermediate_values={},
                    datetime_start=datetime.now(),
                    datetime_complete=None,
                )
            else:
                trial = copy.deepcopy(template_trial)
            trial.number = trial._trial_id = number = self._created
            self._created += 1
            self._trials[number] = trial
            if trial.state == TrialState.WAITING:
                self._waiting[number] = None
            elif trial.state.is_finished():
                self._finished(trial)
            return number

    def _get(self, trial_id: int) -> FrozenTrial:
        try:
            return self._trials[trial_id]
        except KeyError:
            raise KeyError(
                f"trial {trial_id} is not kept (the history keeps {self.keep_last} finished trials "
                f"and the {self.keep_best} best)"
            ) from None

    def _updatable(self, trial_id: int) -> FrozenTrial:
        trial = self._get(trial_id)
        self.check_trial_is_updatable(trial_id, trial.state)
        return copy.copy(trial)  # copy on write: trials handed out unchanged

    def set_trial_param(
        self, trial_id: int, param_name: str, param_value_internal: float, distribution: BaseDistribution
    ) -> None:
        with self._lock:
            trial = self._updatable(trial_id)
            if param_name in self._distributions:
                check_distribution_compatibility(self._distributions[param_name], distribution)
            self._distributions[param_name] = distribution
            trial.params = {**trial.params, param_name: distribution.to_external_repr(param_value_internal)}
            trial.distributions = {**trial.distributions, param_name: distribution}
            self._trials[trial_id] = trial

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        self._get(trial_number)
        return trial_number

    def get_trial_number_from_id(self, trial_id: int) -> int:
        return trial_id

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        with self._lock:
            if len(self._directions) > 1:
                raise RuntimeError("Best trial can be obtained only for single-objective optimization.")
            if self._best_id is None:
                raise ValueError("No trials are completed yet.")
            return self._trials[self._best_id]

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        with self._lock:
            trial = self._updatable(trial_id)
            if state == TrialState.RUNNING and trial.state != TrialState.WAITING:
                return False
            self._waiting.pop(trial_id, None)
            trial.state = state
            if values is not None:
                trial.values = values
            if state == TrialState.RUNNING:
                trial.datetime_start = datetime.now()
            self._trials[trial_id] = trial
            if state.is_finished():
                trial.datetime_complete = datetime.now()
                self._finished(trial)
            return True

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        with self._lock:
            trial = self._updatable(trial_id)
            trial.intermediate_values = {**trial.intermediate_values, step: intermediate_value}
            self._trials[trial_id] = trial

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        with self._lock:
            trial = self._updatable(trial_id)
            trial.user_attrs = {**trial.user_attrs, key: value}
            self._trials[trial_id] = trial

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        with self._lock:
            trial = self._updatable(trial_id)
            trial.system_attrs = {**trial.system_attrs, key: value}
            self._trials[trial_id] = trial

    def get_trial(self, trial_id: int) -> FrozenTrial:
        with self._lock:
            return self._get(trial_id)

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        with self._lock:
            if states == (TrialState.WAITING,):  # Study.ask looks for enqueued trials each time
                trials = [self._trials[n] for n in self._waiting]
            elif states is None:
                trials = list(self._trials.values())
            else:
                trials = [t for t in self._trials.values() if t.state in states]
            return copy.deepcopy(trials) if deepcopy else trials
