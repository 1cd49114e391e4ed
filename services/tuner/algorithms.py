"""NNI's built-in tuners and assessors, by name and ``classArgs``, on Optuna.

:func:`tuner` turns an experiment's ``tuner: {name, classArgs}`` into a :class:`Tuner` over one in-memory
:class:`optuna.Study`; :func:`assessor` turns ``assessor: {name, classArgs}`` into an Optuna pruner. The sections
are read and checked by :mod:`services.tuner.builtins` (without Optuna, for the CLI), and built here.

============  ====================================================  ==========================================
NNI name      Optuna                                                classArgs mapped
============  ====================================================  ==========================================
Random        ``RandomSampler``                                     seed
TPE           ``TPESampler``                                        seed, tpe_args.n_startup_jobs (also at top
                                                                    level) → n_startup_trials, n_ei_candidates
GridSearch    no sampler: the lazy :func:`~services.tuner.space.grid`, in NNI's order, then :class:`NoMoreTrials`
Anneal        ``TPESampler(n_startup_trials=5)`` (substitute)       seed
Evolution     ``NSGAIISampler``                                     population_size (NNI's default 32), seed
Hyperband     ``RandomSampler`` + ``HyperbandPruner``               R → max_resource, eta → reduction_factor
BOHB          ``TPESampler`` + ``HyperbandPruner``                  min_budget, max_budget, eta,
                                                                    min_points_in_model → n_startup_trials
Medianstop    ``MedianPruner(n_startup_trials=1)``                  start_step → n_warmup_steps
Curvefitting  ``PercentilePruner(25)`` (substitute)                 start_step → n_warmup_steps, gap → interval
(none)        ``NopPruner``
============  ====================================================  ==========================================

Every tuner takes ``optimize_mode`` (``maximize``, NNI's default, or ``minimize``): it is the study's direction,
which Optuna's pruners read too, so an assessor's ``optimize_mode`` must agree with the tuner's.

Substitutes, and why:

* **Anneal.** NNI's (hyperopt's) anneal samples around the best trials so far with a shrinking width. Optuna has
  no such sampler; TPE is hyperopt's other model-based search, also concentrates on the good region as results
  come in, and handles every NNI type including nested choices. Five random start-up trials (TPE's default is
  ten) make it exploit early, as annealing does.
* **Hyperband, BOHB.** NNI runs them as advisors that hand each trial its budget (``TRIAL_BUDGET``). Here a trial
  runs to its end unless pruned: the ``step`` of :meth:`Tuner.report` is the resource (an epoch), and Optuna's
  HyperbandPruner stops trials at its rungs. Neither takes an assessor, as in NNI.
* **Curvefitting.** NNI extrapolates each learning curve and stops a trial whose predicted final result is below
  ``threshold`` × the best. Optuna does not fit curves; PercentilePruner stops a trial in the worst quarter of
  trials at the same step, a comparative rule of the same intent. ``epoch_num`` and ``threshold`` are accepted
  and unused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.pruners import BasePruner, HyperbandPruner, MedianPruner, NopPruner, PercentilePruner
from optuna.samplers import BaseSampler, NSGAIISampler, RandomSampler, TPESampler
from optuna.trial import Trial, TrialState

from contracts import TrialStatus
from services.tuner import builtins
from services.tuner.history import DEFAULT_KEEP_LAST, History
from services.tuner.protocol import Metric, NoMoreTrials, ParameterId, Proposal, TrialEnd
from services.tuner.space import Grid, Parameters, SearchSpace, grid, locate, parse_search_space, suggest

__all__ = ["DEFAULT_KEEP_LAST", "NoMoreTrials", "Tuner", "assessor", "build", "tuner"]

log = logging.getLogger(__name__)

_PARAMETERS = "parameters"  # the user attribute holding each trial's parameters in NNI's shape


class Tuner:
    """One experiment's tuner: proposes parameters, learns from metrics, says which trials to stop.

    Call order per trial: :meth:`ask`, then any number of :meth:`report` / :meth:`should_prune`, then exactly one
    :meth:`tell`. Trials may overlap. ``number`` is Optuna's trial number, 0, 1, 2... in order of :meth:`ask`.
    The driver calls it through :class:`~services.tuner.protocol.TunerLike` (:meth:`propose`, :meth:`finish`),
    one call at a time: ``multiThread`` does not apply to Optuna (:mod:`services.tuner.choose` says why).
    """

    judge = "assessor"
    proposers = 0  # asked in turn with every other call

    def __init__(self, study: optuna.Study, space: SearchSpace, points: Grid | None = None) -> None:
        self.study = study
        self.space = space
        self._points = points  # GridSearch: propose these in order instead of asking the sampler
        self._running: dict[int, Trial] = {}
        self._reported: set[int] = set()  # running trials that reported an intermediate result
        self._position = 0  # GridSearch's position in its grid
        self._seen: set[str] = set()  # GridSearch: adopted and proposed points, not proposed again
        self._reseed = False
        self._spaces = 0  # search spaces handed over since the start (update_search_space)

    def ask(self) -> tuple[int, Parameters]:
        """A new trial's number and parameters, in the shape ``nni.get_next_parameter()`` returns.

        :raises NoMoreTrials: GridSearch has proposed every point of its grid once.
        """
        if self._points is not None:
            while self._position < self._points.size and _key(self._points[self._position]) in self._seen:
                self._position += 1
            if self._position >= self._points.size:
                raise NoMoreTrials(f"GridSearch proposed all {self._points.size} points of its grid")
        if self._reseed:  # a seeded sampler resumed would propose its first points again
            self.study.sampler.reseed_rng()
            self._reseed = False
        trial = self.study.ask()
        if self._points is not None:
            params = self._points[self._position]
            self._position += 1
            self._seen.add(_key(params))  # not proposed again from a new space's grid (O(grid) in all)
        else:
            params = suggest(trial, self.space)
        trial.set_user_attr(_PARAMETERS, params)
        self._running[trial.number] = trial
        return trial.number, params

    def propose(self, count: int) -> Proposal:
        """Up to ``count`` new trials from :meth:`ask`; fewer, with the reason, once there are no more."""
        proposal = Proposal()
        for _ in range(count):
            try:
                proposal.trials.append(self.ask())
            except NoMoreTrials as exc:
                proposal.no_more = str(exc)
                break
        return proposal

    def adopt(self, params: Parameters, parameter_id: ParameterId | None = None, *, resumed: bool = False) -> int:
        """Take a running trial this tuner did not propose (its predecessor's before a restart, or one a person
        submitted) as if :meth:`ask` had: it then takes reports and one tell like any other.

        :raises SearchSpaceError: the parameters do not fit the search space; the tuner is unchanged.
        """
        optuna_params, distributions = locate(params, self.space)
        self.study.enqueue_trial(optuna_params)
        trial = self.study.ask(fixed_distributions=distributions)  # takes the enqueued trial and its values
        trial.set_user_attr(_PARAMETERS, params)
        self._running[trial.number] = trial
        if self._points is not None:
            self._seen.add(_key(params))
        self._reseed = True
        return trial.number

    def import_data(self, data: list[dict[str, Any]]) -> None:
        """Earlier results as completed trials of the study (NNI's ``import_data``): TPE counts them among its
        start-up trials and models them like its own. A row outside the search space (or with a metric that is no
        number) cannot be modelled: skipped, and the skipped rows said in one warning. O(rows)."""
        skipped: list[str] = []
        for number, row in enumerate(data, 1):
            params = row.get("parameter")
            try:
                if not isinstance(params, Mapping):
                    raise ValueError("no parameter object")
                optuna_params, distributions = locate(dict(params), self.space)
                value = row.get("value")
                if value is None:
                    raise ValueError("no value")
                score = _number(value)
            except (ValueError, TypeError) as exc:
                skipped.append(f"row {number} ({exc})")
                continue
            self.study.add_trial(
                optuna.trial.create_trial(
                    params=optuna_params,
                    distributions=distributions,
                    value=score,
                    user_attrs={_PARAMETERS: dict(params)},
                )
            )
            if self._points is not None:
                self._seen.add(_key(dict(params)))
        if skipped:
            log.warning(
                "%d of %d imported results are not modelled by the tuner: %s",
                len(skipped),
                len(data),
                "; ".join(skipped[:5]) + ("; …" if len(skipped) > 5 else ""),
            )

    def report(self, number: ParameterId, step: int, value: Metric, *, trial_id: str = "") -> None:
        """An intermediate result (``nni.report_intermediate_result``) at ``step``, for the pruner."""
        self._running[int(number)].report(_number(value), step)  # int: the numbers this tuner gave out
        self._reported.add(int(number))

    def should_prune(self, number: ParameterId, *, trial_id: str = "") -> bool:
        """Whether the assessor would stop the trial now, judged on what :meth:`report` received."""
        return self._running[int(number)].should_prune()

    def tell(self, number: int, value: Metric | None) -> None:
        """The trial's end: its final result, or ``None`` when it has none (early-stopped or failed).

        A trial without a final result counts as pruned when it reported intermediate results (TPE then learns
        from its last one), as failed otherwise.
        :raises ValueError: a final result that is no number (nor a dict with ``default``); the trial is still
            running then, and ``tell(number, None)`` ends it.
        """
        score = None if value is None else _number(value)
        trial = self._running.pop(number)
        if score is not None:
            self.study.tell(trial, score)
        else:
            self.study.tell(trial, state=TrialState.PRUNED if number in self._reported else TrialState.FAIL)
        self._reported.discard(number)

    def finish(self, ends: list[tuple[ParameterId, TrialEnd]]) -> None:
        """Each trial's end: its final result counts when it SUCCEEDED (a final result Optuna cannot read is
        logged, and the trial counts as failed); other ends count as pruned or failed (:meth:`tell`)."""
        for number, end in ends:
            value = end.final if end.status == TrialStatus.SUCCEEDED else None
            try:
                self.tell(int(number), value)
            except (ValueError, TypeError) as exc:
                log.warning("trial %s: final result %r not used by the tuner: %s", end.trial_id, value, exc)
                self.tell(int(number), None)

    def update_search_space(self, search_space: Mapping[str, Any]) -> None:
        """NNI's ``update_search_space``: the next proposals come from ``search_space``. The study keeps what it
        learned (Optuna's samplers take a changed space trial by trial); GridSearch walks the new space's grid from
        its first point, leaving out the points already run. The new space's Optuna parameters are named apart
        from the old ones' (Optuna refuses a choice's new options under its old name), so the samplers learn it
        afresh, as NNI's tuners do.

        :raises SearchSpaceError: a space this tuner cannot search; the tuner is unchanged.
        """
        points = grid(parse_search_space(search_space)) if self._points is not None else None  # clean error paths
        self._spaces += 1
        self.space = parse_search_space(search_space, prefix=f"{self._spaces}:")
        self._points, self._position = points, 0

    def forget(self, number: ParameterId) -> None:
        """A proposal that never ran counts as a failed trial."""
        self.tell(int(number), None)

    def close(self, *, ended: bool, failed: bool = False) -> None:
        """Nothing to release: the study lives in memory."""

    def best(self) -> tuple[Parameters, float]:
        """The best finished trial's parameters and final result; ValueError while none has finished."""
        try:
            best = self.study.best_trial
        except ValueError:
            raise ValueError("no trial has a final result yet") from None
        value = best.value
        assert value is not None  # the best trial is a complete one, with its (single) value
        return best.user_attrs[_PARAMETERS], float(value)


def _key(params: Parameters) -> str:
    return json.dumps(params, sort_keys=True)


def _number(value: Metric) -> float:
    if isinstance(value, Mapping):
        if "default" not in value:
            raise ValueError(f'a metric dict needs the "default" key NNI tunes on, got keys {sorted(value)}')
        value = value["default"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a metric is a number, got {value!r}")
    return float(value)


# --- building ----------------------------------------------------------------------------------
# What a config names is read, and checked, by services.tuner.builtins; here it is built on Optuna.

_Build = Callable[[dict[str, Any], int | None], tuple[BaseSampler, BasePruner | None]]


def _tpe(args: dict[str, Any], seed: int | None) -> tuple[BaseSampler, BasePruner | None]:
    tpe_args = dict(args.get("tpe_args") or {})
    startup = tpe_args.get("n_startup_jobs", args.get("n_startup_jobs", 20))  # NNI's default is 20
    kwargs = {"n_ei_candidates": tpe_args["n_ei_candidates"]} if "n_ei_candidates" in tpe_args else {}
    return TPESampler(n_startup_trials=startup, seed=seed, **kwargs), None


def _bohb(args: dict[str, Any], seed: int | None) -> tuple[BaseSampler, BasePruner | None]:
    pruner = HyperbandPruner(
        min_resource=args.get("min_budget", 1),
        max_resource=args.get("max_budget", 3),
        reduction_factor=args.get("eta", 3),
    )
    return TPESampler(n_startup_trials=args.get("min_points_in_model", 10), seed=seed), pruner


#: Each built-in tuner of builtins.TUNERS: (classArgs, seed) -> (sampler, its own pruner or None). A tuner has a
#: pruner of its own exactly when it is in builtins.PRUNE_THEMSELVES (a test holds the two to it).
_TUNERS: dict[str, _Build] = {
    "Random": lambda a, seed: (RandomSampler(seed=seed), None),
    "TPE": _tpe,
    "GridSearch": lambda a, seed: (RandomSampler(seed=seed), None),
    "Anneal": lambda a, seed: (TPESampler(n_startup_trials=5, seed=seed), None),
    "Evolution": lambda a, seed: (NSGAIISampler(population_size=a.get("population_size", 32), seed=seed), None),
    "Hyperband": lambda a, seed: (
        RandomSampler(seed=seed),
        HyperbandPruner(max_resource=a.get("R", 60), reduction_factor=a.get("eta", 3)),
    ),
    "BOHB": _bohb,
}


def tuner(
    config: Mapping[str, Any] | None,
    space: SearchSpace,
    seed: int | None = None,
    *,
    assessor_config: Mapping[str, Any] | None = None,
    history: int | None = DEFAULT_KEEP_LAST,
) -> Tuner:
    """The :class:`Tuner` NNI's ``tuner`` config names, with the pruner ``assessor_config`` names.

    ``None`` means NNI's default, TPE. ``seed`` seeds the sampler; a ``seed`` in classArgs wins. The study
    keeps the last ``history`` finished trials and the best ones (:class:`~services.tuner.history.History`;
    ``None``: all); Evolution keeps at least two populations, the parents and the generation being built.
    :raises ValueError: what :func:`services.tuner.builtins.choose` refuses, or a value Optuna refuses.
    :raises SearchSpaceError: GridSearch over a space it cannot enumerate.
    """
    return build(builtins.choose(config, assessor_config), space, seed, history=history)


def build(
    choice: builtins.Choice, space: SearchSpace, seed: int | None = None, *, history: int | None = DEFAULT_KEEP_LAST
) -> Tuner:
    """The :class:`Tuner` of ``choice`` over ``space`` (:func:`tuner` says the rest)."""
    seed = choice.args.get("seed", seed)
    sampler, pruner = _TUNERS[choice.tuner](choice.args, seed)
    if pruner is None:
        pruner = _ASSESSORS[choice.assessor](choice.assessor_args) if choice.assessor else NopPruner()
    points = grid(space) if choice.walks_grid else None
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per study ("A new study created…")
    try:
        # Hyperband puts each trial in a bracket by a hash of the study's name: seeded, the name is too, so that
        # the same seed gives the same stops (unseeded, Optuna draws a random name).
        name = None if seed is None else f"trialbus-seed-{seed}"
        if history is not None and isinstance(sampler, NSGAIISampler):
            history = max(history, 2 * choice.args.get("population_size", 32))
        study = optuna.create_study(
            storage=History(history), sampler=sampler, pruner=pruner, direction=choice.direction, study_name=name
        )
    finally:
        optuna.logging.set_verbosity(verbosity)
    return Tuner(study, space, points)


#: Each built-in assessor of builtins.ASSESSORS: classArgs -> its pruner.
_ASSESSORS: dict[str, Callable[[dict[str, Any]], BasePruner]] = {
    # NNI's Medianstop judges against any completed trial: one start-up trial, where Optuna's default is five.
    "Medianstop": lambda a: MedianPruner(n_startup_trials=1, n_warmup_steps=a.get("start_step", 0)),
    "Curvefitting": lambda a: PercentilePruner(
        25.0, n_startup_trials=1, n_warmup_steps=a.get("start_step", 6), interval_steps=a.get("gap", 1)
    ),
}


def assessor(config: Mapping[str, Any] | None) -> BasePruner:
    """The Optuna pruner NNI's ``assessor`` config names; ``None`` (no assessor) never prunes.

    The pruner follows its study's direction; :func:`tuner` checks that ``optimize_mode`` agrees.
    :raises ValueError: an unknown name or classArg, or a bad optimize_mode.
    """
    if config is None:
        return NopPruner()
    name, args = builtins.assessor_choice(config)
    return _ASSESSORS[name](args)
