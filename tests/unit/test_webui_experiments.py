"""The "All experiments" list (services/webui/experiments.py): a row per experiment with its counts
and best from the model's indexes, filtered and sorted as the page's URL asks, and who may act."""

from __future__ import annotations

from datetime import timedelta

import pytest

from contracts import ExperimentStatus, TrialStatus
from contracts.people import ADMIN, READER, Caller
from services.webui.actions import Refused
from services.webui.experiments import listing
from services.webui.model import Model
from tests.unit.test_webui_model import START, experiment, local_config, trial

ANA = Caller("ana", "vision", "member")


@pytest.fixture
def model() -> Model:
    model = Model()
    states = [
        experiment("a1", local_config(experimentName="alpha"), START),
        experiment(
            "b2",
            local_config(
                experimentName="beta",
                trainingService={"platform": "remote", "machineList": [{"host": "h", "user": "u", "password": "p"}]},
            ),
            START + timedelta(hours=1),
        ),
        experiment("c3", local_config(experimentName="Gamma"), START + timedelta(hours=2)),
    ]
    states[0] = states[0].model_copy(update={"team": "vision", "owner": "ana", "status": ExperimentStatus.STOPPED})
    states[1] = states[1].model_copy(update={"team": "nlp", "owner": "bo", "status": ExperimentStatus.DONE})
    for state in states:
        model.put_experiment(state)
    model.put_trial(trial("t1", 0, "a1", status=TrialStatus.SUCCEEDED, final_metric=0.5))
    model.put_trial(trial("t2", 1, "a1", status=TrialStatus.SUCCEEDED, final_metric={"default": 0.9}))
    model.put_trial(trial("t3", 2, "a1", status=TrialStatus.USER_CANCELED))
    model.put_trial(trial("t4", 0, "b2", status=TrialStatus.SUCCEEDED, final_metric=0.7))
    model.put_trial(trial("t5", 0, "c3", status=TrialStatus.RUNNING))
    return model


def ids(rows: list[dict]) -> list[str]:
    return [r["id"] for r in rows]


def test_rows_hold_counts_best_and_owner_newest_first(model: Model) -> None:
    rows = listing(model, {}, ADMIN)
    assert ids(rows) == ["c3", "b2", "a1"]
    alpha = rows[2]
    assert alpha["name"] == "alpha" and alpha["status"] == "STOPPED" and alpha["team"] == "vision"
    assert alpha["trialCount"] == 3 and alpha["trialCounts"]["SUCCEEDED"] == 2
    assert alpha["trialCounts"]["USER_CANCELED"] == 1 and alpha["trialCounts"]["RUNNING"] == 0
    assert alpha["best"] == 0.9 and alpha["bestTrial"] == {"trialId": "t2", "sequenceId": 1}
    assert rows[1]["platforms"] == ["remote"] and rows[0]["best"] is None
    # a trial that changes moves the counts and the best at once
    model.put_trial(trial("t3", 2, "a1", status=TrialStatus.SUCCEEDED, final_metric=1.5))
    again = listing(model, {"q": "alpha"}, ADMIN)[0]
    assert again["trialCounts"]["SUCCEEDED"] == 3 and again["best"] == 1.5


def test_filters_and_sorts_as_the_url_says(model: Model) -> None:
    assert ids(listing(model, {"q": "GAM"}, ADMIN)) == ["c3"]
    assert ids(listing(model, {"q": "b2"}, ADMIN)) == ["b2"]
    assert ids(listing(model, {"status": "STOPPED,DONE"}, ADMIN)) == ["b2", "a1"]
    assert ids(listing(model, {"platform": "remote"}, ADMIN)) == ["b2"]
    assert ids(listing(model, {"team": "vision"}, ADMIN)) == ["a1"]
    assert ids(listing(model, {"sort": "name", "order": "asc"}, ADMIN)) == ["a1", "b2", "c3"]
    assert ids(listing(model, {"sort": "trials", "order": "desc"}, ADMIN)) == [
        "a1",
        "c3",
        "b2",
    ]  # ties by id, the same way
    # without a best metric: last, either way
    assert ids(listing(model, {"sort": "best", "order": "asc"}, ADMIN)) == ["b2", "a1", "c3"]
    assert ids(listing(model, {"sort": "best", "order": "desc"}, ADMIN)) == ["a1", "b2", "c3"]
    for bad in ({"sort": "nope"}, {"order": "up"}, {"status": "PAUSED"}):
        with pytest.raises(Refused) as refused:
            listing(model, bad, ADMIN)
        assert refused.value.status == 400


def test_may_change_follows_the_persons_team_and_role(model: Model) -> None:
    mine = {r["id"]: r["mayChange"] for r in listing(model, {}, ANA)}
    assert mine == {"a1": True, "b2": False, "c3": False}  # c3 has no team: admins only
    assert all(r["mayChange"] for r in listing(model, {}, ADMIN))
    assert not any(r["mayChange"] for r in listing(model, {}, READER))
