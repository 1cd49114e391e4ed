"""What the tuner service would refuse in an experiment's config, found where the config is written: the CLI and
``trialbus.Experiment`` call :func:`check` before they create anything, so a wrong name or classArg is an error
at the prompt, not an experiment that ends at once.

It loads no user class (they load where the tuner service runs, beside their code and the ``nni`` package) and,
for the usual config, not Optuna either: a built-in tuner's and assessor's names, classArgs' names and
``optimize_mode`` are read by :mod:`services.tuner.builtins`; Optuna (~0.3 s of CPU to import, a third of the
command's own start) is asked only when a classArg's value goes into one of its constructors
(:attr:`~services.tuner.builtins.Choice.reaches_optuna`), exactly as :func:`services.tuner.choose.for_experiment`
builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from services.tuner import builtins, loading
from services.tuner.nni_classes import BUILTIN_ASSESSORS
from services.tuner.space import grid, parse_search_space

if TYPE_CHECKING:
    from contracts import ExperimentConfig

__all__ = ["assessor_class", "check", "tuner_section"]


def tuner_section(config: ExperimentConfig) -> tuple[Mapping[str, Any] | None, str]:
    """The config's ``tuner`` (or ``advisor``) section and which of the two it is."""
    if config.search_space is None:
        raise ValueError("the experiment has no searchSpace (or searchSpaceFile) for its tuner to search")
    return (config.tuner, "tuner") if config.tuner else (config.advisor, "advisor")


def assessor_class(config: Mapping[str, Any]) -> dict[str, Any]:
    """An assessor section beside a tuner class: a class as it is, a built-in name as NNI's class of that name."""
    if loading.names_class(config):
        return dict(config)
    name, args = builtins.name_and_args(config, "assessor")
    path = BUILTIN_ASSESSORS.get(name.lower())
    if path is None:
        known = ", ".join(p.rpartition(".")[2].removesuffix("Assessor") for p in BUILTIN_ASSESSORS.values())
        raise ValueError(f"unknown assessor {name!r}; the known assessors are {known}")
    return {"className": path, "classArgs": args}


def check(config: ExperimentConfig) -> None:
    """Refuse what can be refused without loading the user's classes: the built-in names, their classArgs and
    search space as :func:`~services.tuner.choose.for_experiment` builds them, and the shape of class sections.
    ValueError (or its SearchSpaceError) with the reason."""
    tuner_config, kind = tuner_section(config)
    if loading.names_class(tuner_config):
        loading.spec(tuner_config, kind)
        if config.assessor:
            loading.spec(assessor_class(config.assessor), "assessor")
        return
    space = parse_search_space(config.search_space)
    judged_by_class = loading.names_class(config.assessor)
    if judged_by_class and config.assessor:  # (names_class: it is there)
        loading.spec(config.assessor, "assessor")
    choice = builtins.choose(tuner_config, None if judged_by_class else config.assessor)
    if choice.walks_grid:
        grid(space)
    if choice.reaches_optuna:
        from services.tuner import algorithms  # Optuna: only for a value it may refuse

        algorithms.build(choice, space)
