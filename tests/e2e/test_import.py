"""Importing earlier results (nnictl experiment import): `trialbus experiment import ID -f results.json|csv`.

A real stack (dispatcher, gateway, local adapter, tuner service as processes on a real nats-server) and NNI trial
code whose final result peaks at x = 0.9 over a 1-D uniform space. The results imported (20 points over [0, 1],
their values peaking at 0.9) reach a seeded TPE before it proposes: Optuna's TPE counts them among its 20 start-up
trials, so its first proposals come from its model of them, near 0.9, where the same seed without them draws at
random over [0, 1] (mean distance to 0.9 about 0.5).
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import nats
from nats.js.errors import KeyNotFoundError

from contracts import streams
from tests.e2e.helpers import wait_until
from tests.fixtures.stack import Stack

TRIALBUS = str(Path(sys.executable).parent / "trialbus")
PEAK = 0.9
TRIAL = textwrap.dedent(
    """
    import os, time
    import nni

    params = nni.get_next_parameter()
    time.sleep(float(os.environ.get("TRIAL_SLEEP", "0")))
    nni.report_final_result(-abs(params["x"] - 0.9))
    """
)
#: 20 results over [0, 1], the best near 0.9: what an earlier run would have found.
ROWS = [
    {"parameter": {"x": round(i / 20 + 0.025, 3)}, "value": -abs(round(i / 20 + 0.025, 3) - PEAK)} for i in range(20)
]


def config(code: Path, trials: int, concurrency: int) -> dict:
    return {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": concurrency,
        "maxTrialNumber": trials,
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
        "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize", "seed": 1}},
        "trainingService": {"platform": "local", "useActiveGpu": False},
    }


def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return code


def run_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "200"}
    return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=60)


def create(stack: Stack, body: dict, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    made = stack.rest("POST", "/experiments", json=body, headers=headers)
    assert made.status_code == 201, made.text
    return made.json()["id"]


def imported(stack: Stack, experiment_id: str) -> int:
    return stack.rest("GET", f"/experiments/{experiment_id}").json()["imported"]


def proposals(stack: Stack, experiment_id: str, count: int) -> list[float]:
    """The x of the experiment's first ``count`` trials, in the order the tuner proposed them."""

    def trials() -> list[dict]:
        page = stack.rest("GET", f"/experiments/{experiment_id}/trials").json()["trials"]
        return page if len(page) >= count else []

    found = wait_until(trials, 60, f"{count} trials of {experiment_id}\n{stack.logs()}")
    return [t["parameters"]["x"] for t in sorted(found, key=lambda t: t["sequenceId"])[:count]]


async def stored_rows(stack: Stack, experiment_id: str) -> list | None:
    """The imported rows the bus keeps for the experiment (the ``imports`` bucket), or None."""
    nc = await nats.connect(stack.nats.url)
    try:
        kv = await nc.jetstream().key_value(streams.IMPORTS_BUCKET.bucket)
        try:
            return json.loads((await kv.get(experiment_id)).value)
        except KeyNotFoundError:
            return None
    finally:
        await nc.close()


def distance(xs: list[float]) -> float:
    return sum(abs(x - PEAK) for x in xs) / len(xs)


def add_user(stack: Stack, name: str, team: str, role: str = "member") -> str:
    answer = stack.rest("POST", "/users", json={"name": name, "team": team, "role": role})
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def refused(answer: httpx.Response, status: int, words: str) -> None:
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert words in answer.json()["error"], answer.text


def test_imported_results_reach_tpe_before_its_first_proposals(tmp_path: Path, nats_server) -> None:
    # Given a stack whose tuner service is not up yet, and three experiments of the same seeded TPE
    stack = Stack(root=tmp_path, nats=nats_server)
    stack.start("dispatcher", "gateway", "adapter")
    try:
        code = code_dir(tmp_path)
        ana = add_user(stack, "ana", "vision")  # from_json is hers; the admin imports into it
        bo = add_user(stack, "bo", "nlp")
        vic = add_user(stack, "vic", "vision", "viewer")
        plain = create(stack, config(code, 4, 4))
        from_json = create(stack, config(code, 4, 4), token=ana)
        from_csv = create(stack, config(code, 4, 4))

        # When earlier results are imported with the CLI, as nnictl's JSON and as the CSV nnictl exports
        (tmp_path / "results.json").write_text(json.dumps(ROWS))
        with (tmp_path / "results.csv").open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["x", "reward", "trialJobId"])
            writer.writerows([row["parameter"]["x"], row["value"], f"old{i}"] for i, row in enumerate(ROWS))
        done = run_cli(stack, "experiment", "import", from_json, "-f", str(tmp_path / "results.json"))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "imported 20 results" in done.stdout
        done = run_cli(stack, "experiment", "import", from_csv, "--filename", str(tmp_path / "results.csv"))
        assert done.returncode == 0, done.stdout + done.stderr

        # Then the experiments show how many they keep
        assert (imported(stack, plain), imported(stack, from_json), imported(stack, from_csv)) == (0, 20, 20)

        # And bad files and bodies are refused, naming the row, and nothing is imported
        bad = {
            "missing.json": None,
            "empty.json": "",
            "no-value.json": json.dumps([*ROWS[:2], {"parameter": {"x": 0.5}}]),
            "not-a-list.json": json.dumps({"parameter": {"x": 0.5}, "value": 1}),
            "no-metric.csv": "x,loss\n0.5,1\n",
            "text-metric.csv": "x,reward\n0.5,1\n0.6,high\n",
        }
        said = {
            "missing.json": "no such file",
            "empty.json": "the file is empty",
            "no-value.json": "row 3 has no",
            "not-a-list.json": "a JSON list of",
            "no-metric.csv": "no metric column",
            "text-metric.csv": "line 3: reward is 'high', not a number",
        }
        for name, text in bad.items():
            if text is not None:
                (tmp_path / name).write_text(text)
            done = run_cli(stack, "experiment", "import", plain, "-f", str(tmp_path / name))
            assert done.returncode == 1, (name, done.stdout, done.stderr)
            assert said[name] in done.stderr + done.stdout, (name, done.stderr)
        refused(stack.rest("POST", f"/experiments/{plain}/import", json=[*ROWS, {"value": 1}]), 422, "row 21")
        refused(
            stack.rest("POST", f"/experiments/{plain}/import", json=[{"parameter": {"x": 1}, "value": "x"}]),
            422,
            "row 1: value must be a finite number",
        )
        many = [{"parameter": {"x": 0.5}, "value": 0}] * 20_001  # a cap, said with the figures
        refused(stack.rest("POST", f"/experiments/{plain}/import", json=many), 413, "at most 20000 rows")
        assert imported(stack, plain) == 0

        # And only the experiment's team may import: another team's member and a viewer get 403
        as_ = {"Authorization": f"Bearer {bo}"}
        refused(stack.rest("POST", f"/experiments/{from_json}/import", json=ROWS, headers=as_), 403, "team vision")
        as_ = {"Authorization": f"Bearer {vic}"}
        refused(stack.rest("POST", f"/experiments/{from_json}/import", json=ROWS, headers=as_), 403, "viewer")
        assert imported(stack, from_json) == 20
        trail = stack.rest("GET", "/audit", params={"experiment": from_json}).json()
        records = [(r["user"], r["status"], r.get("message")) for r in trail if r["action"] == "experiment.import"]
        assert ("admin", 200, "imported 20 results") in records, trail
        assert ("bo", 403) in {(user, status) for user, status, _ in records}, trail

        # When the tuner service comes up
        stack.start("tuner")

        # Then TPE's first proposals lie near the imported results' best, and without them they do not
        first = {e: proposals(stack, e, 4) for e in (plain, from_json, from_csv)}
        assert distance(first[from_json]) < 0.12, first
        assert distance(first[plain]) > distance(first[from_json]) + 0.2, first
        # And the CSV's rows are the JSON's: the same seed proposes the same points from them
        assert first[from_csv] == first[from_json], first

        # And a deleted experiment's imported results go with it
        wait_until(lambda: stack.rest("GET", f"/experiments/{from_json}").json()["status"] == "DONE", 60, "DONE")
        assert stack.rest("POST", f"/experiments/{from_json}/delete").status_code == 200
        assert asyncio.run(stored_rows(stack, from_json)) is None
        assert asyncio.run(stored_rows(stack, from_csv)) == ROWS
    finally:
        stack.stop()


def test_results_imported_while_the_experiment_runs_reach_the_tuner_at_once(tmp_path: Path, nats_server) -> None:
    # Given a running experiment of a seeded TPE, one trial at a time, each taking two seconds
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"TRIAL_SLEEP": "2"})
    stack.start("dispatcher", "gateway", "adapter", "tuner")
    try:
        experiment = create(stack, config(code_dir(tmp_path), 3, 1))
        wait_until(lambda: stack.rest("GET", f"/experiments/{experiment}/trials").json()["trials"], 30, "a trial")

        # When earlier results are imported while its first trial runs
        answer = stack.rest("POST", f"/experiments/{experiment}/import", json=ROWS)
        assert answer.status_code == 200, answer.text
        assert answer.json()["imported"] == 20

        # Then the tuner's next proposals come from them: near 0.9
        xs = proposals(stack, experiment, 3)
        assert distance(xs[1:]) < 0.12, (xs, stack.logs())
        assert "the tuner learnt from 20 imported results" in stack.log("tuner")
    finally:
        stack.stop()
