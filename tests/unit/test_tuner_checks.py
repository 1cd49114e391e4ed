"""The check the CLI runs before it creates an experiment (services/tuner/checks.py) refuses exactly what the tuner
service would refuse when it builds the experiment's tuner, and loads Optuna only for a classArg's value it may
refuse (services/tuner/builtins.py reads the rest)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from contracts import ExperimentConfig
from services.tuner import algorithms, builtins
from services.tuner.checks import check
from services.tuner.choose import for_experiment
from services.tuner.space import SearchSpaceError

SPACE = {"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}, "bs": {"_type": "choice", "_value": [16, 32]}}


def config(tuner: dict[str, Any] | None, assessor: dict[str, Any] | None = None, space=SPACE) -> ExperimentConfig:
    fields = {
        "trialCommand": "python3 trial.py",
        "trialConcurrency": 1,
        "trainingService": {"platform": "local"},
        "searchSpace": space,
    }
    fields.update({"tuner": tuner} if tuner is not None else {})
    fields.update({"assessor": assessor} if assessor is not None else {})
    return ExperimentConfig.model_validate(fields)


CONFIGS = [
    # Accepted.
    config({"name": "Random", "classArgs": {"optimize_mode": "maximize"}}),
    config({"name": "tpe", "classArgs": {"optimize_mode": "minimize", "tpe_args": {"n_startup_jobs": 5}}}),
    config({"name": "Evolution", "classArgs": {"population_size": 8}}),
    config({"name": "GridSearch"}, space={"bs": {"_type": "choice", "_value": [16, 32]}}),
    config({"name": "Hyperband", "classArgs": {"R": 9, "eta": 3}}),
    config({"builtinTunerName": "BOHB", "classArgs": {"max_budget": 9}}),
    config({"name": "TPE"}, {"name": "Medianstop", "classArgs": {"start_step": 2}}),
    config(
        {"name": "Anneal", "classArgs": {"optimize_mode": "minimize"}},
        {"name": "Curvefitting", "classArgs": {"optimize_mode": "minimize", "gap": 2}},
    ),
    config({"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}, {"name": "Medianstop"}),  # it follows TPE
    # Refused by a name, a classArg's name or optimize_mode, read without Optuna.
    config({"name": "Bayes"}),
    config({"name": "Random", "classArgs": {"optimise_mode": "max"}}),
    config({"name": "Random", "classArgs": {"optimize_mode": "max"}}),
    config({"name": "TPE", "classArgs": {"tpe_args": {"n_startup": 3}}}),
    config({"name": "Hyperband"}, {"name": "Medianstop"}),
    config({"name": "TPE"}, {"name": "Medianstop", "classArgs": {"optimize_mode": "minimize"}}),
    config({"name": "TPE"}, {"name": "Mediamstop"}),
    config({"name": "GridSearch"}, space={"lr": {"_type": "uniform", "_value": [0, 1]}}),
    config({"name": "Random", "classArgs": ["optimize_mode"]}),
    # Refused by Optuna, for a value it was given.
    config({"name": "Evolution", "classArgs": {"population_size": 1}}),
    config({"name": "Hyperband", "classArgs": {"R": "sixty"}}),
    config({"name": "TPE"}, {"name": "Medianstop", "classArgs": {"start_step": -1}}),
]


def outcome(call, cfg: ExperimentConfig) -> str:
    try:
        call(cfg)
    except (ValueError, SearchSpaceError) as exc:  # SearchSpaceError is a ValueError too
        return f"refused: {exc}"
    return "accepted"


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: repr(c.tuner) + repr(c.assessor or ""))
def test_the_check_refuses_what_building_the_tuner_refuses_with_the_same_reason(cfg: ExperimentConfig) -> None:
    built = outcome(for_experiment, cfg)
    assert outcome(check, cfg) == built
    if "Bayes" in repr(cfg.tuner):
        assert (
            built == "refused: unknown tuner 'Bayes'; the known tuners are Random, TPE, GridSearch, Anneal, "
            "Evolution, Hyperband, BOHB"
        )


def test_the_cases_above_include_refusals_of_each_kind() -> None:
    said = [outcome(check, cfg) for cfg in CONFIGS]
    assert said.count("accepted") == 9
    assert any("population_size` must be greater" in s for s in said)  # Optuna's own refusal
    assert any("optimize_mode" in s for s in said)


def test_every_built_in_name_is_built_as_its_table_says() -> None:
    assert set(algorithms._TUNERS) == set(builtins.TUNERS)
    assert set(algorithms._ASSESSORS) == set(builtins.ASSESSORS)
    for name in builtins.TUNERS:
        sampler, pruner = algorithms._TUNERS[name]({}, 0)
        assert (pruner is not None) == (name in builtins.PRUNE_THEMSELVES), name


def run_check(tuner: str) -> list[str]:
    """Check a config in a fresh interpreter, as the CLI does; the heavy modules it loaded."""
    code = (
        "import sys\n"
        "from contracts import ExperimentConfig\n"
        "from trialbus.experiment import check_tuner\n"
        "check_tuner(ExperimentConfig.model_validate({'trialCommand': 'python3 t.py', 'trialConcurrency': 1, "
        "'trainingService': "
        f"{{'platform': 'local'}}, 'searchSpace': {SPACE!r}, 'tuner': {tuner}}}))\n"
        "print(sorted(m for m in ('optuna', 'numpy') if m in sys.modules))\n"
    )
    return eval(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_checking_a_usual_config_loads_no_optuna_and_one_with_values_for_it_does() -> None:
    assert run_check("{'name': 'TPE', 'classArgs': {'optimize_mode': 'maximize'}}") == []
    assert run_check("{'name': 'Evolution', 'classArgs': {'population_size': 8}}") == ["numpy", "optuna"]
