"""Changing a running experiment (``PATCH /experiments/{id}``, ``trialbus update``, nnictl's ``update``), on the
stack as processes: the dispatcher fills new slots at once, refuses a bad value with nothing changed and another
team's member, keeps the change over a restart, and the tuner service proposes from a new search space."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import config, write_code
from tests.e2e.helpers import submit, wait_until
from tests.fixtures.stack import Stack

TRIALBUS = str(Path(sys.executable).parent / "trialbus")
#: A trial as the tuner runs it: its parameters, a short wait, its final result.
TRIAL = (
    "import time, nni\n"
    "params = nni.get_next_parameter()\n"
    "time.sleep(params['sleep'])\n"
    "nni.report_final_result(params['x'])\n"
)


def counts(stack: Stack, experiment_id: str) -> dict[str, int]:
    return stack.rest("GET", f"/experiments/{experiment_id}").json()["trialCounts"]


def the_config(stack: Stack, experiment_id: str) -> dict:
    return stack.rest("GET", f"/experiments/{experiment_id}").json()["config"]


def run_cli(stack: Stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}
    return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_raising_concurrency_fills_the_new_slots_at_once_and_a_bad_value_changes_nothing(stack, code_dir):
    experiment = stack.rest("POST", "/experiments", json=config(code_dir, trialConcurrency=2)).json()["id"]
    for x in range(6):
        submit(stack, experiment, {"x": x, "sleep": 60})
    wait_until(lambda: counts(stack, experiment).get("RUNNING") == 2, 30, "2 trials RUNNING")
    assert counts(stack, experiment).get("WAITING") == 4

    # given 2 running and 4 waiting, when concurrency goes to 4, then 4 are in flight at once
    began = time.monotonic()
    answer = stack.rest("PATCH", f"/experiments/{experiment}", json={"trialConcurrency": 4})
    assert answer.status_code == 200, answer.text
    assert answer.json()["changes"] == {"trialConcurrency": {"from": 2, "to": 4}}
    dispatched = wait_until(
        lambda: (c := counts(stack, experiment)).get("WAITING", 0) == 2 and c, 5, "4 trials dispatched"
    )
    dispatched_ms = (time.monotonic() - began) * 1000
    wait_until(lambda: counts(stack, experiment).get("RUNNING") == 4, 5, "4 trials RUNNING")
    running_ms = (time.monotonic() - began) * 1000
    print(f"concurrency 2→4: 4 in flight after {dispatched_ms:.0f} ms (4 RUNNING after {running_ms:.0f} ms)")
    assert dispatched.get("RUNNING", 0) + dispatched.get("WAITING", 0) == 6

    # a bad value, an unknown key, a wrong duration: 422 naming it, and nothing changed
    for body, said in (
        ({"trialConcurrency": 0}, "trialConcurrency"),
        ({"trialConcurrency": 3, "maxExperimentDuration": "2 fortnights"}, "bad duration"),
        ({"trialConcurency": 3}, "trialConcurency"),
        ({"maxTrialNumber": 3}, "give 6 or more"),
        ({"searchSpace": {"x": [1, 2]}}, '"_type"'),
        ({}, "nothing to change"),
    ):
        refused = stack.rest("PATCH", f"/experiments/{experiment}", json=body)
        assert refused.status_code == 422 and said in refused.json()["error"], (body, refused.text)
    kept = the_config(stack, experiment)
    assert kept["trialConcurrency"] == 4 and kept.get("maxExperimentDuration") is None

    # the limits in NNI's units; the audit trail says who changed what from what to what
    answer = stack.rest(
        "PATCH", f"/experiments/{experiment}", json={"maxExperimentDuration": "2h", "maxTrialNumber": 8}
    )
    assert answer.json()["changes"] == {
        "maxExperimentDuration": {"from": None, "to": 7200.0},
        "maxTrialNumber": {"from": None, "to": 8},
    }
    said = [
        r
        for r in stack.rest("GET", "/audit", params={"experiment": experiment}).json()
        if r["action"] == "experiment.update"
    ]
    assert [r["message"] for r in said if r["status"] == 200] == [
        "trialConcurrency 2 → 4",
        "maxTrialNumber none → 8, maxExperimentDuration none → 7200",
    ]

    # a restarted dispatcher keeps the change
    stack.restart("dispatcher")
    kept = wait_until(lambda: the_config(stack, experiment), 30, "the dispatcher back")
    assert (kept["trialConcurrency"], kept["maxTrialNumber"], kept["maxExperimentDuration"]) == (4, 8, 7200)

    # a STOPPED experiment may change too: its new limits hold when it resumes
    stack.rest("DELETE", f"/experiments/{experiment}")
    stopped = stack.rest("PATCH", f"/experiments/{experiment}", json={"maxTrialNumber": 10})
    assert stopped.status_code == 200, stopped.text


def add(stack: Stack, name: str, team: str, role: str = "member") -> str:
    answer = stack.rest("POST", "/users", json={"name": name, "team": team, "role": role})
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def test_only_the_experiments_team_and_admins_may_change_it(stack, code_dir):
    ana, bo, vi = add(stack, "ana", "vision"), add(stack, "bo", "nlp"), add(stack, "vi", "vision", "viewer")

    def patch(token: str, body: dict):
        return stack.rest(
            "PATCH", f"/experiments/{experiment}", json=body, headers={"Authorization": f"Bearer {token}"}
        )

    made = stack.rest(
        "POST", "/experiments", json=config(code_dir, trialConcurrency=1), headers={"Authorization": f"Bearer {ana}"}
    )
    experiment = made.json()["id"]
    refused = patch(bo, {"trialConcurrency": 3})
    assert refused.status_code == 403 and "belongs to team vision" in refused.json()["error"]
    assert patch(vi, {"trialConcurrency": 3}).status_code == 403
    assert the_config(stack, experiment)["trialConcurrency"] == 1
    assert patch(ana, {"trialConcurrency": 3}).status_code == 200
    assert stack.rest("PATCH", f"/experiments/{experiment}", json={"trialConcurrency": 5}).status_code == 200
    assert stack.rest("PATCH", "/experiments/nosuchone", json={"trialConcurrency": 5}).status_code == 404


def test_trialbus_update_searchspace_changes_what_the_tuner_proposes_next(tuned: Stack, tmp_path: Path) -> None:
    code_dir = write_code(tmp_path, TRIAL)
    space = {"x": {"_type": "choice", "_value": [1, 2, 3]}, "sleep": {"_type": "choice", "_value": [0.3]}}
    experiment = tuned.rest(
        "POST",
        "/experiments",
        json=config(code_dir, trialConcurrency=1, maxTrialNumber=40, searchSpace=space, tuner={"name": "Random"}),
    ).json()["id"]

    def trials() -> list[dict]:
        return tuned.rest("GET", f"/experiments/{experiment}/trials").json()["trials"]

    wait_until(lambda: len(trials()) >= 2, 60, "the tuner's first trials")
    new = code_dir.parent / "space.json"
    new.write_text(json.dumps({"x": {"_type": "choice", "_value": [100, 200]}, "sleep": space["sleep"]}))
    done = run_cli(tuned, "update", "searchspace", experiment, "-f", str(new))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"experiment {experiment}: searchSpace" in done.stdout
    before = len(trials())
    # at most the trial in flight and one proposed meanwhile come from the old space; every later one from the new

    def three_later() -> list[dict] | None:
        found = trials()
        return found[before + 2 : before + 5] if len(found) >= before + 5 else None

    later = wait_until(three_later, 60, "3 more trials")
    assert [t["parameters"]["x"] in (100, 200) for t in later] == [True] * 3, later
    assert all(t["parameters"]["x"] in (1, 2, 3) for t in trials()[:2])

    # nnictl's spelling, and the line the CLI prints; the tuner then keeps two trials in flight
    done = run_cli(tuned, "update", "concurrency", experiment, "--value", "2")
    assert done.returncode == 0 and f"experiment {experiment}: trialConcurrency 1 → 2" in done.stdout, done.stderr
    since = len(trials())

    def two_at_once() -> bool:
        ran = sorted((t for t in trials()[since:] if t["endTime"]), key=lambda t: t["startTime"])
        return any(b["startTime"] < a["endTime"] for a, b in zip(ran, ran[1:], strict=False))

    wait_until(two_at_once, 30, "two trials running at once")
    done = run_cli(tuned, "update", "duration", experiment, "2h")
    assert "maxExperimentDuration none → 7200" in done.stdout, done.stdout + done.stderr
    done = run_cli(tuned, "update", "trialnum", experiment, "0")
    assert done.returncode == 1 and "above 0" in done.stderr
    tuned.rest("DELETE", f"/experiments/{experiment}")
