"""What a change of a running experiment may hold (``PATCH /experiments/{id}``, :mod:`services.dispatcher.updates`):
the config's own rules, all or nothing, and a line that says what changed."""

from __future__ import annotations

import pytest

from services.common.api import ApiError
from services.dispatcher.updates import describe, parse_change


def test_a_change_takes_the_configs_names_and_units() -> None:
    assert parse_change({"trialConcurrency": 4, "max_experiment_duration": "2h", "maxTrialNumber": 10}) == {
        "trial_concurrency": 4,
        "max_trial_number": 10,
        "max_experiment_duration": 7200.0,
    }
    assert parse_change({"searchSpace": {"lr": {"_type": "uniform", "_value": [0, 1]}}})["search_space"]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"trialConcurrency": 0}, "trialConcurrency: Input should be greater than 0"),
        ({"trialConcurrency": "many"}, "trialConcurrency"),
        ({"maxExperimentDuration": "2 weeks"}, "bad duration '2 weeks'"),
        ({"maxTrialNumber": None}, "maxTrialNumber cannot be null"),
        ({"trialCommand": "rm -rf /"}, "trialCommand"),
        ({"searchSpace": {}}, "the search space is empty"),
        ({"searchSpace": {"lr": [1, 2]}}, "parameter 'lr' needs a \"_type\""),
        ({}, "nothing to change"),
        ([1], "must be a JSON object"),
    ],
)
def test_a_bad_change_is_a_422_that_names_it(body: object, said: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_change(body)
    assert refused.value.status == 422 and said in refused.value.message, refused.value.message


def test_the_line_says_what_changed_from_what_to_what() -> None:
    assert describe({"trial_concurrency": (2, 4), "max_experiment_duration": (None, 7200.0)}) == (
        "trialConcurrency 2 → 4, maxExperimentDuration none → 7200"
    )
    assert describe({"search_space": ({"lr": {}}, {"lr": {}, "momentum": {}})}) == "searchSpace +momentum"
    moved = ({"x": {"_type": "uniform", "_value": [0, 1]}, "y": {}}, {"x": {"_type": "uniform", "_value": [2, 3]}})
    assert describe({"search_space": moved}) == "searchSpace -y; x: uniform [0, 1] → uniform [2, 3]"
    same = {"x": {"_type": "choice", "_value": list(range(100))}}
    assert describe({"search_space": (same, same)}) == "searchSpace unchanged"
    long = {"x": {"_type": "choice", "_value": list(range(100, 200))}}
    assert len(describe({"search_space": (same, long)})) < 160  # a long spec is cut
