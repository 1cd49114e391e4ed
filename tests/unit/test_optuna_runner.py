"""trialbus.optuna's pieces without a stack: the objective's address, the runner's conventions, the
ask contract (docs/optuna.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts import subjects
from contracts.asks import NAME_CHARS, Ask
from trialbus.optuna.optimize import _value, objective_spec
from trialbus.optuna.remote import Asker, AskError
from trialbus.optuna.runner import classes_of, load_objective


def module_level(trial):
    return 0.0


def test_the_objective_is_named_by_module_and_shipped_with_its_directory():
    spec, directory = objective_spec(module_level, None)
    assert spec == f"{__name__}:module_level"
    assert directory == Path(__file__).resolve().parents[2]  # tests.unit.… is imported from the repo root
    assert load_objective(spec) is module_level
    assert objective_spec(module_level, "/elsewhere")[1].as_posix() == "/elsewhere"


def test_a_lambda_or_a_closure_is_refused_with_why():
    def inner(trial):
        return 0.0

    for objective in (lambda trial: 0.0, inner):
        with pytest.raises(ValueError, match="top level of a module"):
            objective_spec(objective, None)
    with pytest.raises(ValueError, match="<module>:<function>"):
        load_objective("no_colon")


def test_catch_matches_the_exception_classes_the_runner_tells():
    assert classes_of(KeyError("k"))[:3] == ["builtins.KeyError", "builtins.LookupError", "builtins.Exception"]


def test_a_final_result_is_a_number_or_nnis_default():
    assert [_value(v) for v in (1, 2.5, {"default": 3}, None, "x", True, float("nan"))] == [
        1.0,
        2.5,
        3.0,
        None,
        None,
        None,
        None,
    ]


def test_an_ask_goes_out_without_its_trial_id_which_the_gateway_takes_from_the_url():
    asker = Asker("http://gw:8081/", "tok", "e1", "t1", attempt=2, owner="ann")
    assert asker.url == "http://gw:8081/api/v1/trials/t1/ask"
    body = json.loads(asker.body("suggest", name="x", distribution="{}"))
    assert "trialId" not in body and body["op"] == "suggest" and body["owner"] == "ann" and body["attempt"] == 2


def test_asks_are_validated():
    with pytest.raises(ValidationError):
        Ask(experiment_id="e", trial_id="t", op="shell")
    with pytest.raises(ValidationError):
        Ask(experiment_id="e", trial_id="t", op="suggest", name="x" * (NAME_CHARS + 1))
    with pytest.raises(ValidationError):
        Ask(experiment_id="e", trial_id="t", op="report", step=-1)
    assert subjects.asks(None, "e", "t") == "asks._.e.t" and subjects.asks("ann", "e", "*") == "asks.ann.e.*"


def test_a_trial_without_a_keeper_says_what_it_lacks():
    with pytest.raises(AskError, match="TRIALBUS_GATEWAY_URL, TRIALBUS_ASK_TOKEN"):
        Asker.from_env({"NNI_EXP_ID": "e", "NNI_TRIAL_JOB_ID": "t"})
