"""NNI's built-in tuners and assessors by name: the classArgs each takes, and what a config's ``tuner`` and
``assessor`` sections ask for (a :class:`Choice`), read without Optuna.

:mod:`services.tuner.algorithms` builds a choice on Optuna (its docstring says what each name becomes). The split
is for the CLI: ``trialbus experiment run`` refuses a config the tuner service could not run before it creates
anything (:mod:`services.tuner.checks`), and importing Optuna, with numpy, costs ~0.3 s of CPU on a small host,
a third of the command's own start. A choice's names, classArgs' names and ``optimize_mode`` are checked here;
Optuna is asked only when a classArg's value goes into one of its constructors (:attr:`Choice.reaches_optuna`),
which may refuse it (``population_size: 1``, a negative ``start_step``).

Config keys match case-insensitively (``name`` or NNI v1's ``builtinTunerName``/``builtinAssessorName``), and
so do names; ``classArgs`` keys are spelled as NNI spells them, and one NNI does not take (or we do not map) is a
ValueError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ASSESSORS", "TUNERS", "Choice", "assessor_choice", "choose", "name_and_args"]

#: Each built-in tuner: the classArgs it takes besides ``optimize_mode`` and ``seed``.
TUNERS: dict[str, frozenset[str]] = {
    "Random": frozenset(),
    "TPE": frozenset({"tpe_args", "n_startup_jobs"}),
    "GridSearch": frozenset(),
    "Anneal": frozenset(),
    "Evolution": frozenset({"population_size"}),
    "Hyperband": frozenset({"R", "eta", "exec_mode"}),
    "BOHB": frozenset({"min_budget", "max_budget", "eta", "min_points_in_model"}),
}
#: TPE's ``tpe_args``: the keys it takes.
TPE_ARGS = frozenset({"n_startup_jobs", "n_ei_candidates"})
#: The tuners that stop trials by themselves (a pruner of their own), and so take no assessor, as in NNI.
PRUNE_THEMSELVES = frozenset({"Hyperband", "BOHB"})
#: The tuners that walk the search space's grid.
WALK_THE_GRID = frozenset({"GridSearch"})
#: Each built-in assessor: the classArgs it takes besides ``optimize_mode`` and ``start_step``.
ASSESSORS: dict[str, frozenset[str]] = {
    "Medianstop": frozenset(),
    "Curvefitting": frozenset({"epoch_num", "threshold", "gap"}),
}


@dataclass(frozen=True)
class Choice:
    """A built-in tuner and its assessor (if any) as a config names them, every name and classArg's name checked."""

    #: The tuner's name as :data:`TUNERS` spells it.
    tuner: str
    #: Its classArgs.
    args: dict[str, Any]
    #: ``maximize`` or ``minimize``: the study's direction.
    direction: Literal["maximize", "minimize"]
    #: The assessor's name as :data:`ASSESSORS` spells it; None: none.
    assessor: str | None = None
    #: Its classArgs.
    assessor_args: dict[str, Any] = field(default_factory=dict)

    @property
    def walks_grid(self) -> bool:
        return self.tuner in WALK_THE_GRID

    @property
    def reaches_optuna(self) -> bool:
        """Whether a classArg's value goes into an Optuna constructor (which may refuse it): every one but
        ``optimize_mode``, which is checked here."""
        return bool(set(self.args) - {"optimize_mode"} or set(self.assessor_args) - {"optimize_mode"})


def choose(tuner_config: Mapping[str, Any] | None, assessor_config: Mapping[str, Any] | None = None) -> Choice:
    """The built-in tuner ``tuner_config`` names (``None``: NNI's default, TPE), judged by the built-in assessor
    ``assessor_config`` names (``None``: none).

    :raises ValueError: an unknown name or classArg, a bad optimize_mode, an assessor whose optimize_mode
        disagrees with the tuner's, or an assessor beside a tuner that stops trials by itself.
    """
    name, args = name_and_args(tuner_config or {"name": "TPE"}, "tuner")
    name, accepted = _lookup(name, TUNERS, "tuner")
    _check_args(name, args, accepted | {"optimize_mode", "seed"})
    if name == "TPE":
        _check_args("TPE's tpe_args", dict(args.get("tpe_args") or {}), TPE_ARGS)
    direction = _direction(name, args)
    if assessor_config is None:
        return Choice(name, args, direction)
    if name in PRUNE_THEMSELVES:
        raise ValueError(f"{name} stops trials by itself and takes no assessor")
    assessor, assessor_args = assessor_choice(assessor_config)
    if "optimize_mode" in assessor_args and assessor_args["optimize_mode"] != direction:
        raise ValueError(
            f"assessor {assessor} has optimize_mode {assessor_args['optimize_mode']!r} "
            f"but tuner {name} has {direction!r}"
        )
    return Choice(name, args, direction, assessor, assessor_args)


def assessor_choice(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The built-in assessor ``config`` names, as :data:`ASSESSORS` spells it, and its classArgs.

    :raises ValueError: an unknown name or classArg, or a bad optimize_mode.
    """
    name, args = name_and_args(config, "assessor")
    name, accepted = _lookup(name, ASSESSORS, "assessor")
    _check_args(name, args, accepted | {"optimize_mode", "start_step"})
    _direction(name, args)
    return name, args


def name_and_args(config: Mapping[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    """A built-in ``{name, classArgs}`` section's name and classArgs (v1's ``builtin<Kind>Name`` too)."""
    keys = {str(k).lower(): v for k, v in config.items()}
    name = keys.get("name", keys.get(f"builtin{kind}name"))
    if not isinstance(name, str):
        raise ValueError(f"the {kind} config needs a name (a built-in {kind}), got {dict(config)!r}")
    args = keys.get("classargs") or {}
    if not isinstance(args, Mapping):
        raise ValueError(f"{kind} {name}: classArgs must be an object, got {args!r}")
    return name, dict(args)


def _lookup(name: str, table: Mapping[str, frozenset[str]], kind: str) -> tuple[str, frozenset[str]]:
    for known, accepted in table.items():
        if known.lower() == name.lower():
            return known, accepted
    raise ValueError(f"unknown {kind} {name!r}; the known {kind}s are {', '.join(table)}")


def _check_args(name: str, args: Mapping[str, Any], accepted: frozenset[str] | set[str]) -> None:
    if unknown := sorted(set(args) - accepted):
        raise ValueError(f"{name} does not take classArgs {unknown}; it takes {sorted(accepted)}")


def _direction(name: str, args: Mapping[str, Any]) -> Literal["maximize", "minimize"]:
    mode = args.get("optimize_mode", "maximize")
    if mode not in ("maximize", "minimize"):
        raise ValueError(f'{name}: optimize_mode is "maximize" or "minimize", got {mode!r}')
    return mode
