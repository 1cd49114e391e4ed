"""An NNI user's nnictl habits, typed as ``trialbus`` commands against ``trialbus up``.

nnictl create / view / top / trial ls / log trial / experiment export / stop / resume / trial kill,
each run as a user types it (the installed ``trialbus`` in a subprocess) on a stack started with
``trialbus up`` on free ports, its tuner service proposing the trials. The CLI finds the stack as a
user's shell does: ``TRIALBUS_DATA_DIR`` (its ``client.json``) and ``TRIALBUS_NATS_URL``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.helpers import wait_until
from tests.fixtures.nats import nats_server_binary, require_binary
from tests.fixtures.up import TRIALBUS, Up, new_ports, processes

pytestmark = pytest.mark.timeout(240)

#: NNI trial code: x = 0.25 fails, 0.5 reports a number, 0.75 a dict; two intermediate results each.
TRIAL = textwrap.dedent(
    """
    import sys, time
    import nni

    params = nni.get_next_parameter()
    print(f"hello from x={params['x']}", flush=True)
    for step in range(2):
        nni.report_intermediate_result(params["x"] * (step + 1))
    time.sleep(params.get("sleep", 0))
    if params["x"] == 0.25:
        sys.exit(3)
    nni.report_final_result(params["x"] if params["x"] == 0.5 else {"default": params["x"], "loss": 1 - params["x"]})
    """
)


class Home:
    """A data dir, free ports and NNI code; ``up()`` starts the stack, ``cli()`` types a command."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.ports = new_ports()
        self.code = root / "code"
        self.code.mkdir()
        (self.code / "trial.py").write_text(TRIAL)
        self.ups: list[Up] = []

    def up(self) -> Up:
        """The stack, started by the first test that asks (the module's tests share it, as one user's session)."""
        if self.ups and self.ups[-1].proc.poll() is None:
            return self.ups[-1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"}
        up = Up(self.data_dir, self.ports, {**env, "COLUMNS": "300"}, self.root / f"up-{len(self.ups)}.log")
        self.ups.append(up)
        up.wait_for("Trialbus is up")
        return up

    def env(self, **more: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"}
        return {
            **env,
            "TRIALBUS_DATA_DIR": str(self.data_dir),
            "TRIALBUS_NATS_URL": self.ups[-1].nats_url,
            "COLUMNS": "250",
            **more,
        }

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [TRIALBUS, *args], env=self.env(), capture_output=True, text=True, timeout=timeout, cwd=self.root
        )

    def config(self, name: str, **settings) -> Path:
        """An NNI v2 config file for the trial code, with ``settings`` over the defaults."""
        config = {
            "experimentName": name,
            "trialCommand": f"{sys.executable} trial.py",
            "trialCodeDirectory": str(self.code),
            "trialConcurrency": 2,
            "searchSpace": {"x": {"_type": "choice", "_value": [0.25, 0.5, 0.75]}},
            "tuner": {"name": "GridSearch"},
            "trainingService": {"platform": "local"},
            **settings,
        }
        path = self.root / f"{name}.yml"
        path.write_text(yaml.safe_dump(config))
        return path

    @property
    def webui(self) -> str:
        return f"http://127.0.0.1:{self.ports['webui']}"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    require_binary(nats_server_binary(), "nats-server")
    home = Home(tmp_path_factory.mktemp("nnictl"))
    yield home
    for up in home.ups:
        up.kill()
    if (home.data_dir / "stack.json").exists():
        for process in processes(home.data_dir).values():
            process.kill()


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def created(done: subprocess.CompletedProcess) -> str:
    found = re.search(r"created experiment (\w+)", ok(done))
    assert found, done.stdout
    return found.group(1)


def experiment_of(up: Up, experiment: str) -> dict:
    return up.rest("GET", f"/experiments/{experiment}").json()


def trials_of(up: Up, experiment: str) -> list[dict]:
    return up.rest("GET", f"/experiments/{experiment}/trials").json()["trials"]  # in submission order


def statuses(up: Up, experiment: str) -> dict[str, str]:
    return {t["id"]: t["status"] for t in trials_of(up, experiment)}


def status_is(up: Up, experiment: str, status: str, timeout: float = 90) -> dict:
    return wait_until(
        lambda: (e := experiment_of(up, experiment))["status"] == status and e,
        timeout,
        f"experiment {experiment} {status}",
    )


def running(up: Up, experiment: str, count: int) -> list[dict]:
    return wait_until(
        lambda: len(r := [t for t in trials_of(up, experiment) if t["status"] == "RUNNING"]) >= count and r,
        60,
        f"{count} trials RUNNING",
    )


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_create_view_top_trial_ls_log_trial_and_export_as_nnictl_users_type_them(home: Home) -> None:
    # Given `trialbus up` and an NNI config whose GridSearch makes three trials: one fails, one reports a
    # number, one a dict
    up = home.up()

    # When the user types nnictl's `create --config` (as `trialbus create -c`)
    experiment = created(home.cli("create", "-c", str(home.config("habits"))))
    url = f"{home.webui}/experiments/{experiment}"

    # Then it runs with its tuner, and `view` prints its page on the stack's own web UI port, opening nothing
    assert url in ok(home.cli("view", experiment)).splitlines()
    assert httpx.get(url, headers={"Authorization": f"Bearer {up.local.api_token}"}).status_code == 200
    done = status_is(up, experiment, "DONE")
    trials = {t["parameters"]["x"]: t for t in trials_of(up, experiment)}
    assert {x: t["status"] for x, t in trials.items()} == {0.25: "FAILED", 0.5: "SUCCEEDED", 0.75: "SUCCEEDED"}
    failed, number, mapping = trials[0.25], trials[0.5], trials[0.75]

    # And `top --once` shows it: DONE, three trials ended, the best (0.75) and its trial
    row = next(line for line in ok(home.cli("top", "--once")).splitlines() if experiment in line)
    assert all(word in row for word in ("habits", "DONE", "local", " 3 ", "0.75", mapping["id"])), row

    # And `trial ls` lists the three; `--head 1` the best, `--tail 1` the lowest of those with a result
    listed = ok(home.cli("trial", "ls", experiment))
    assert all(t["id"] in listed for t in trials.values()) and "FAILED" in listed and "local-gpu" in listed
    assert mapping["id"] in ok(home.cli("trial", "ls", experiment, "--head", "1"))
    assert number["id"] not in ok(home.cli("trial", "ls", experiment, "--head", "1"))
    assert number["id"] in ok(home.cli("trial", "ls", experiment, "--tail", "1"))

    # And `log trial EXP -T TRIAL` (nnictl's form) and `log trial TRIAL` print the trial's output
    assert "hello from x=0.5" in ok(home.cli("log", "trial", experiment, "-T", number["id"]))
    assert "hello from x=0.25" in ok(home.cli("log", "trial", failed["id"]))
    wrong = home.cli("log", "trial", "nosuchexp", "--trial_id", number["id"])
    assert wrong.returncode == 1 and f"trial {number['id']} is not in experiment nosuchexp" in wrong.stderr

    # And `experiment export --type json --filename` writes NNI's records, each trial's status added
    exported = home.root / "export.json"
    assert "exported 3 trials" in ok(
        home.cli("experiment", "export", experiment, "--type", "json", "--filename", str(exported))
    )
    records = json.loads(exported.read_text())
    assert [r["trialJobId"] for r in records] == [t["id"] for t in trials_of(up, experiment)], "in sequence order"
    by_id = {r["trialJobId"]: r for r in records}
    assert by_id[number["id"]] == {
        "parameter": number["parameters"],
        "value": "0.5",
        "trialJobId": number["id"],
        "status": "SUCCEEDED",
    }
    assert json.loads(by_id[mapping["id"]]["value"]) == {"default": 0.75, "loss": 0.25}, "NNI's value: JSON text"
    assert (by_id[failed["id"]]["value"], by_id[failed["id"]]["status"]) == (None, "FAILED")

    # And `--type csv` to stdout has NNI's columns (parameters, the result's keys or reward, trialJobId)
    rows = list(csv.DictReader(io.StringIO(ok(home.cli("experiment", "export", experiment, "-t", "csv")))))
    by_id = {r["trialJobId"]: r for r in rows}
    assert set(rows[0]) == {"x", "reward", "default", "loss", "trialJobId", "status"}
    assert (by_id[number["id"]]["reward"], by_id[number["id"]]["default"]) == ("0.5", "")
    assert (by_id[mapping["id"]]["default"], by_id[mapping["id"]]["loss"]) == ("0.75", "0.25")
    assert (by_id[failed["id"]]["x"], by_id[failed["id"]]["status"]) == ("0.25", "FAILED")

    # And `--intermediate` adds each trial's intermediate results, as NNI's JSON texts
    records = json.loads(ok(home.cli("experiment", "export", experiment, "-t", "json", "-i")))
    assert {r["trialJobId"]: r["intermediate"] for r in records}[number["id"]] == ["0.5", "1.0"]

    # And a DONE experiment whose tuner had no more trials is not resumed: the error says why
    assert done["noMoreTrials"] is True
    again = home.cli("resume", experiment)
    assert again.returncode == 1, again.stdout
    assert f"experiment {experiment} is DONE: its tuner had no more trials to propose" in again.stderr
    assert experiment_of(up, experiment)["status"] == "DONE"


def test_stop_and_resume_go_on_where_the_experiment_stopped_its_time_stopped_not_counted(home: Home) -> None:
    # Given an experiment with maxExperimentDuration 20s running two trials
    up = home.up()
    # (5 s each: still running when the `stop` typed next arrives, however loaded the machine)
    space = {"x": {"_type": "choice", "_value": [0.5]}, "sleep": {"_type": "choice", "_value": [5.0]}}
    config = home.config(
        "resumed", maxTrialNumber=4, maxExperimentDuration="20s", tuner={"name": "Random"}, searchSpace=space
    )
    began = time.monotonic()
    experiment = created(home.cli("create", "--config", str(config)))
    first = running(up, experiment, 2)

    # When the user types `stop` (no ID: the one running experiment), as nnictl's
    assert f"experiment {experiment}: STOPPED" in ok(home.cli("stop"))
    stopped = time.monotonic()

    # Then its trials are canceled and it takes none
    wait_until(lambda: set(statuses(up, experiment).values()) == {"USER_CANCELED"}, 30, "the cancels")
    assert set(statuses(up, experiment)) == {t["id"] for t in first}

    # When it stays stopped past its maxExperimentDuration, then the user types `resume ID`
    time.sleep(max(0.0, 21 - (time.monotonic() - began)))
    paused = time.monotonic() - stopped
    resumed = ok(home.cli("resume", experiment))
    assert f"experiment {experiment}: RUNNING" in resumed and f"{home.webui}/experiments/{experiment}" in resumed

    # Then the tuner service drives it again: two new trials run to their end, and it is DONE at maxTrialNumber
    final = status_is(up, experiment, "DONE")
    wall = time.monotonic() - began
    assert [t["status"] for t in trials_of(up, experiment)] == ["USER_CANCELED"] * 2 + ["SUCCEEDED"] * 2

    # And the time it stood stopped did not count: its duration is the time it ran, under the limit
    ran = (when(final["endTime"]) - when(final["startTime"])).total_seconds() - final["stoppedSeconds"]
    assert 0 < ran < 20 and ran <= wall - paused + 0.5, (ran, wall, paused)
    assert final["stoppedSeconds"] >= paused - 0.5, "the time stopped is kept apart, startTime stays the first start"

    # And a resume of the DONE experiment says why there is nothing to run
    again = home.cli("resume", experiment)
    assert (
        again.returncode == 1
        and f"experiment {experiment} is DONE: it has run maxTrialNumber (4) trials" in again.stderr
    ), again.stderr


def test_trial_kill_live_top_and_stop_all(home: Home) -> None:
    # Given an experiment running two long trials
    up = home.up()
    space = {"x": {"_type": "choice", "_value": [0.5]}, "sleep": {"_type": "choice", "_value": [120]}}
    config = home.config("long", maxTrialNumber=6, tuner={"name": "Random"}, searchSpace=space)
    experiment = created(home.cli("create", "-c", str(config)))
    one, two = running(up, experiment, 2)[:2]

    # When the user watches `top` (a terminal: it redraws every --time seconds) and presses Ctrl-C
    top = subprocess.Popen(
        [TRIALBUS, "top", "--time", "0.5"],
        env=home.env(TTY_COMPATIBLE="1", TTY_INTERACTIVE="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        time.sleep(3)
    finally:
        os.killpg(top.pid, signal.SIGINT)
        shown = top.communicate(timeout=15)[0].decode(errors="replace")

    # Then it showed the experiment RUNNING, redrawn, and Ctrl-C ended it cleanly
    assert top.returncode == 0, shown
    assert experiment in shown and "RUNNING" in shown and "long" in shown
    assert re.search(r"\d+ experiments?, 1 running", shown), shown  # the earlier tests' experiments have ended
    assert len(set(re.findall(r"refreshed (\d\d:\d\d:\d\d)", shown))) >= 2, f"redrawn: {shown!r}"

    # When the user kills one trial nnictl's way (`trial kill EXP -T TRIAL`) and one by its id alone
    assert f"trial {one['id']}:" in ok(home.cli("trial", "kill", experiment, "-T", one["id"]))
    assert f"trial {two['id']}:" in ok(home.cli("trial", "kill", two["id"]))

    # Then both end USER_CANCELED, and the tuner goes on with new trials
    wait_until(
        lambda: statuses(up, experiment)[one["id"]] == statuses(up, experiment)[two["id"]] == "USER_CANCELED",
        30,
        "the kills",
    )
    running(up, experiment, 2)

    # When the user types `stop --all`
    assert f"experiment {experiment}: STOPPED" in ok(home.cli("stop", "--all"))

    # Then nothing runs, and a `stop` with nothing running says so
    wait_until(lambda: all(t["status"] != "RUNNING" for t in trials_of(up, experiment)), 30, "the trials to end")
    nothing = home.cli("stop")
    assert nothing.returncode == 1 and "no experiment is running" in nothing.stderr
