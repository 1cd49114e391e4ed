"""Why trials fail, said at once: a failed trial's last stderr line reaches `trialbus experiment run`,
`trialbus top` and the REST API with the command that prints its log, and an experiment whose first
trials all fail the same way stops (``failFast``) instead of running maxTrialNumber trials that fail alike.

A real stack (dispatcher, gateway, local adapter, tuner) on a real nats-server; real trial processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, wait_until
from tests.fixtures.stack import Stack

TRIALBUS = str(Path(sys.executable).parent / "trialbus")
MISSING = "ModuleNotFoundError: No module named 'no_such_module_xyz'"


def run_cli(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}
    return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def said(done: subprocess.CompletedProcess) -> str:
    """What the command printed, its line wrapping undone (rich wraps long lines at the width)."""
    return " ".join(done.stdout.split())


def broken_config(tmp_path: Path, **settings) -> Path:
    """An NNI config whose trial cannot import what it needs (as a missing ``sklearn`` would)."""
    code = tmp_path / "broken"
    code.mkdir()
    (code / "trial.py").write_text("import nni\nimport no_such_module_xyz\nnni.report_final_result(1.0)\n")
    settings = {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 2,
        "maxTrialNumber": 30,
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
        "tuner": {"name": "Random"},
        "trainingService": {"platform": "local"},
        **settings,
    }
    path = code / "config.yml"
    path.write_text(yaml.safe_dump(settings))
    return path


def test_an_experiment_whose_first_trials_fail_alike_stops_and_says_why(tuned: Stack, tmp_path: Path) -> None:
    # When a config whose trials all fail is run (maxTrialNumber 30)
    done = run_cli(tuned, "experiment", "run", "-f", str(broken_config(tmp_path)))

    # Then it stops after its first 3 failures, not 30, and says why, and how to go on
    [experiment] = tuned.rest("GET", "/experiments").json()
    trials = tuned.rest("GET", f"/experiments/{experiment['id']}/trials").json()["trials"]
    failed = sorted((t for t in trials if t["status"] == "FAILED"), key=lambda t: t["endTime"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert experiment["status"] == "STOPPED" and MISSING in experiment["message"], experiment
    assert "failFast" in experiment["message"] and any(f"trial {t['id']})" in experiment["message"] for t in failed)
    # (the trials running when it stopped, trialConcurrency at most, are canceled, or fail before the cancel comes)
    assert 3 <= len(failed) <= len(trials) <= 3 + 2, [(t["id"], t["status"]) for t in trials]
    assert all(t["status"] == "USER_CANCELED" for t in trials if t["status"] != "FAILED")
    assert all(t["lastError"] == MISSING and t["exitCode"] == 1 for t in failed)
    out = said(done)
    assert f"trial {failed[0]['id']} failed (exit 1): {MISSING}; whole log: trialbus log trial {failed[0]['id']}" in out
    assert "failFast" in out and f"trialbus resume {experiment['id']}" in out and "STOPPED" in out

    # and the log command it names prints the whole story
    log = run_cli(tuned, "log", "trial", failed[0]["id"])
    assert log.returncode == 0 and "Traceback" in log.stdout and MISSING in log.stdout, log.stdout + log.stderr

    # and `trialbus top` says it too (its first failure by trial number)
    top = said(run_cli(tuned, "top", "--once"))
    first = min(failed, key=lambda t: t["sequenceId"])["id"]
    assert f"{experiment['id']}: trial {first} failed (exit 1): {MISSING}; whole log: trialbus log trial {first}" in top
    assert "failFast" in top

    # and `trialbus watch`
    watched = said(run_cli(tuned, "watch", experiment["id"]))
    assert (
        f"trial {failed[0]['id']} failed (exit 1): {MISSING}; whole log: trialbus log trial {failed[0]['id']}"
        in watched
    )


def test_with_fail_fast_off_every_trial_runs(tuned: Stack, tmp_path: Path) -> None:
    done = run_cli(
        tuned, "experiment", "run", "-f", str(broken_config(tmp_path, failFast=0, maxTrialNumber=6, trialConcurrency=3))
    )
    [experiment] = tuned.rest("GET", "/experiments").json()
    trials = tuned.rest("GET", f"/experiments/{experiment['id']}/trials").json()["trials"]
    assert done.returncode == 0, done.stdout + done.stderr  # DONE, as NNI would end it
    assert experiment["status"] == "DONE" and not experiment.get("message")
    assert [t["status"] for t in trials] == ["FAILED"] * 6
    out = said(done)
    assert MISSING in out and "trialbus log trial" in out and "no trial reported a final result" in out


def test_different_failures_or_a_success_first_leave_it_running(stack: Stack, code_dir: Path) -> None:
    # Given two experiments: one whose trials fail each its own way, one whose first trial succeeds
    mixed = create(stack, config(code_dir, trialConcurrency=1, maxTrialNumber=10))
    lucky = create(stack, config(code_dir, trialConcurrency=1, maxTrialNumber=10))
    for n in range(4):
        failure = ended(stack, submit(stack, mixed, {"x": n, "exit": 1, "stderr": f"ValueError: bad x={n}"}))
        assert (failure["status"], failure["lastError"]) == ("FAILED", f"ValueError: bad x={n}")
    assert ended(stack, submit(stack, lucky, {"x": 1}))["status"] == "SUCCEEDED"
    for n in range(4):
        assert ended(stack, submit(stack, lucky, {"x": n, "exit": 1, "stderr": MISSING}))["status"] == "FAILED"

    # Then both still run and take trials
    for experiment in (mixed, lucky):
        assert stack.rest("GET", f"/experiments/{experiment}").json()["status"] == "RUNNING"
        assert ended(stack, submit(stack, experiment, {"x": 9}))["status"] == "SUCCEEDED"


def test_three_trials_failing_alike_stop_an_experiment_driven_through_the_api(stack: Stack, code_dir: Path) -> None:
    experiment = create(stack, config(code_dir, trialConcurrency=1, maxTrialNumber=10, failFast=2))
    for n in range(2):
        ended(stack, submit(stack, experiment, {"x": n, "exit": 3, "stderr": f"step {n}\nRuntimeError: no GPU"}))
    stopped = wait_until(
        lambda: (e := stack.rest("GET", f"/experiments/{experiment}").json())["status"] == "STOPPED" and e,
        10,
        "the experiment to stop",
    )
    assert "first 2 trials failed the same way: RuntimeError: no GPU" in stopped["message"]
    refused = stack.rest("POST", f"/experiments/{experiment}/trials", json={"parameters": {"x": 5}})
    assert refused.status_code == 409 and "STOPPED" in refused.text
    # A resume runs it again, and the guard, having said its piece, lets it run
    assert stack.rest("POST", f"/experiments/{experiment}/resume").json()["status"] == "RUNNING"
    for n in range(3):
        ended(stack, submit(stack, experiment, {"x": n, "exit": 3, "stderr": "RuntimeError: no GPU"}))
    assert stack.rest("GET", f"/experiments/{experiment}").json()["status"] == "RUNNING"
