"""Experiment limits as NNI users know them: maxTrialDuration, maxExperimentDuration, stop."""

from __future__ import annotations

import time

from tests.e2e.conftest import config
from tests.e2e.helpers import wait_until


def trial(stack, trial_id: str) -> dict:
    return stack.rest("GET", f"/trials/{trial_id}").json()


def submit(stack, experiment: str, parameters: dict):
    return stack.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": parameters})


def test_trial_past_max_trial_duration_is_early_stopped(stack, code_dir):
    experiment = stack.rest("POST", "/experiments", json=config(code_dir, maxTrialDuration="1s")).json()["id"]
    slow = submit(stack, experiment, {"x": 1, "sleep": 60}).json()["id"]
    quick = submit(stack, experiment, {"x": 2}).json()["id"]
    body = wait_until(lambda: (b := trial(stack, slow))["status"] == "EARLY_STOPPED" and b, 10, "EARLY_STOPPED")
    assert "maxTrialDuration (1s)" in body["message"]
    assert wait_until(lambda: trial(stack, quick)["status"] == "SUCCEEDED", 10, "quick trial SUCCEEDED")


def test_stopping_an_experiment_cancels_queued_and_running_trials(stack, code_dir):
    experiment = stack.rest("POST", "/experiments", json=config(code_dir, trialConcurrency=1)).json()["id"]
    running = submit(stack, experiment, {"x": 1, "sleep": 60}).json()["id"]
    queued = submit(stack, experiment, {"x": 2}).json()["id"]
    wait_until(lambda: trial(stack, running)["status"] == "RUNNING", 20, "RUNNING")
    answer = stack.rest("DELETE", f"/experiments/{experiment}")
    assert answer.status_code == 200 and answer.json()["status"] == "STOPPED"
    wait_until(lambda: trial(stack, running)["status"] == "USER_CANCELED", 5, "running trial USER_CANCELED")
    assert trial(stack, queued)["status"] == "USER_CANCELED"
    refused = submit(stack, experiment, {"x": 3})
    assert refused.status_code == 409 and "STOPPED" in refused.json()["error"]


def test_experiment_past_max_duration_takes_no_trials_and_ends_queued_ones(stack, code_dir):
    experiment = stack.rest(
        "POST", "/experiments", json=config(code_dir, trialConcurrency=1, maxExperimentDuration="2s")
    ).json()["id"]
    first = submit(stack, experiment, {"x": 1, "sleep": 3}).json()["id"]
    waiting = submit(stack, experiment, {"x": 2}).json()["id"]
    time.sleep(2.2)
    refused = submit(stack, experiment, {"x": 3})
    assert refused.status_code == 409 and "maxExperimentDuration (2s)" in refused.json()["error"]
    body = wait_until(lambda: (b := trial(stack, waiting))["status"] == "SYS_CANCELED" and b, 5, "SYS_CANCELED")
    assert "maxExperimentDuration" in body["message"]
    # the running trial is allowed to finish, then the experiment is DONE
    assert wait_until(lambda: trial(stack, first)["status"] == "SUCCEEDED", 10, "running trial finishes")
    wait_until(lambda: stack.rest("GET", f"/experiments/{experiment}").json()["status"] == "DONE", 5, "DONE")
