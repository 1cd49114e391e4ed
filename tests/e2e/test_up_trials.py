"""What a stop of ``trialbus up`` does to running trials, with the real services.

A user's stop (Ctrl-C, SIGTERM, ``trialbus down``) ends the running trials, recorded
USER_CANCELED with the reason, as ``nnictl stop`` does: no GPU stays held by a trial nobody
watches. ``--keep-trials`` leaves them running, and the next ``up`` adopts them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import nats
import pytest
import yaml

from tests.e2e.conftest import config, write_code
from tests.e2e.helpers import create, submit, wait_until
from tests.fixtures.nats import NatsServer, nats_server_binary, require_binary
from tests.fixtures.up import TRIALBUS, Up, gone, new_ports, ports_free, processes
from trialbus.stack.processes import ProcessId

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def home(tmp_path: Path):
    """A data dir, free ports, a code dir and a run log; every `up` started is killed at the end."""
    require_binary(nats_server_binary(), "nats-server")

    class Home:
        data_dir = tmp_path / "data"
        ports = new_ports()
        code = write_code(tmp_path)
        run_log = tmp_path / "runs.log"
        ups: list[Up] = []

        def up(self, *args: str, command: list[str] | None = None) -> Up:
            env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"}
            env.update(RUN_LOG=str(self.run_log), COLUMNS="300")
            up = Up(self.data_dir, self.ports, env, tmp_path / f"up-{len(self.ups)}.log", list(args), command)
            self.ups.append(up)
            return up

        def trial_processes(self) -> dict[str, ProcessId]:
            """Each trial's process, from the line it wrote when it started (id, pid, pgid)."""
            found = {}
            for line in self.run_log.read_text().splitlines():
                trial_id, pid, _ = line.split()
                found[trial_id] = ProcessId.of(int(pid)) or ProcessId(int(pid), 0.0)
            return found

    home = Home()
    yield home
    for up in home.ups:
        up.kill()
    if (home.data_dir / "stack.json").exists():
        for process in processes(home.data_dir).values():
            process.kill()


def running(up: Up, experiment: str, count: int, run_log: Path) -> None:
    """Until ``count`` trials are RUNNING and each has started its code (written its line)."""
    wait_until(
        lambda: len(up.rest("GET", f"/experiments/{experiment}/trials?status=RUNNING").json()["trials"]) == count,
        60,
        f"{count} trials RUNNING",
    )
    wait_until(lambda: run_log.exists() and len(run_log.read_text().splitlines()) >= count, 30, "the trials' code")


async def recorded(store: Path, bucket: str, key: str) -> dict:
    """A value of a KV bucket, read from the stopped stack's JetStream store with a nats-server of our own."""
    server = NatsServer(store).start()
    try:
        nc = await nats.connect(server.url)
        entry = await (await nc.jetstream().key_value(bucket)).get(key)
        await nc.close()
        return json.loads(entry.value)
    finally:
        server.stop()


@pytest.mark.parametrize(("how", "said"), [("ctrl-c", "Ctrl-C"), ("sigterm", "SIGTERM"), ("down", "`trialbus down`")])
def test_a_stop_ends_running_trials_cancelled_with_the_reason_and_frees_everything(home, how, said):
    # Given the stack with two trials running
    up = home.up()
    up.wait_for("Trialbus is up")
    experiment = create(up, config(home.code, trialConcurrency=2))
    ids = [submit(up, experiment, {"x": i, "sleep": 120}) for i in range(2)]
    running(up, experiment, 2, home.run_log)
    stack, trials = up.processes(), home.trial_processes()
    assert set(trials) == set(ids)

    # When the user presses Ctrl-C, sends SIGTERM, or runs `trialbus down` in another terminal
    if how == "ctrl-c":
        up.ctrl_c()
    elif how == "sigterm":
        up.signal(signal.SIGTERM)
    else:
        down = subprocess.run(
            [TRIALBUS, "down", "--data-dir", str(home.data_dir)], capture_output=True, text=True, timeout=60
        )
        assert down.returncode == 0 and "stopped the stack" in down.stderr, down.stderr

    # Then everything stops within 30 s: the trials, the services, nats-server; every port is free
    assert up.wait(30) == 0, up.text()
    reason = f"trialbus up stopped ({said})"
    assert f"stopped experiment {experiment} (2 running trials cancelled: {reason})" in up.text()
    assert gone(trials.values(), 1) and gone(stack.values(), 1) and ports_free(home.ports)

    # And the trials are recorded cancelled, with the reason, the experiment stopped
    store = home.data_dir / "nats"
    for trial_id in ids:
        state = asyncio.run(recorded(store, "trials", trial_id))
        assert state["status"] == "USER_CANCELED"
        assert state["message"] == f"the experiment was stopped: {reason}"
    state = asyncio.run(recorded(store, "experiments", experiment))
    assert (state["status"], state["message"]) == ("STOPPED", reason)


@pytest.mark.parametrize("where", ["up", "down"])
def test_keep_trials_leaves_them_running_for_the_next_up_to_adopt(home, where):
    # Given `up --keep-trials` (or a plain `up` that `down --keep-trials` will stop) with two trials running
    up = home.up(*(["--keep-trials"] if where == "up" else []))
    up.wait_for("Trialbus is up")
    experiment = create(up, config(home.code, trialConcurrency=2))
    ids = [submit(up, experiment, {"x": i, "sleep": 20}) for i in range(2)]
    running(up, experiment, 2, home.run_log)
    trials = home.trial_processes()

    # When it is stopped
    if where == "up":
        up.signal(signal.SIGTERM)
    else:
        down = subprocess.run(
            [TRIALBUS, "down", "--keep-trials", "--data-dir", str(home.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert down.returncode == 0 and "running trials left running" in down.stderr, down.stderr
    assert up.wait(30) == 0, up.text()

    # Then the trials run on
    assert all(p.alive() for p in trials.values()) and "stopped experiment" not in up.text()

    # And the next `up` adopts them: each ends SUCCEEDED with its result, having run once
    again = home.up()
    again.wait_for("Trialbus is up")
    for i, trial_id in enumerate(ids):
        final = wait_until(
            lambda t=trial_id: (s := again.rest("GET", f"/trials/{t}").json())["status"] != "RUNNING" and s,
            60,
            f"{trial_id} to end",
        )
        assert final["status"] == "SUCCEEDED" and final["finalMetric"]["default"] == i, final
    assert sorted(home.trial_processes()) == sorted(ids), "each ran once"
    again.ctrl_c()
    assert again.wait(30) == 0


def test_ctrl_c_during_experiment_run_stops_the_command_the_trials_and_the_stack(home, tmp_path):
    # Given `trialbus up -- trialbus experiment run -f config.yml`, as `make run` runs it
    nni_config = {
        "experimentName": "ctrl-c",
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(home.code),
        "trialConcurrency": 2,
        "maxTrialNumber": 4,
        "trainingService": {"platform": "local"},
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}, "sleep": {"_type": "choice", "_value": [120]}},
        "tuner": {"name": "Random"},
    }
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(nni_config))
    trialbus = str(Path(sys.executable).parent / "trialbus")
    up = home.up(command=[trialbus, "experiment", "run", "-f", str(path)])
    up.wait_for("Trialbus is up")
    experiment = wait_until(lambda: (e := up.rest("GET", "/experiments").json()) and e[0]["id"], 60, "the experiment")
    running(up, experiment, 2, home.run_log)
    assert f"web UI: http://127.0.0.1:{home.ports['webui']}/experiments/{experiment}" in up.text(), "on its own port"
    stack, trials = up.processes(), home.trial_processes()

    # When the user presses Ctrl-C
    up.ctrl_c()

    # Then the command, the trials and the stack are gone within 30 s; `up` exits with the command's code
    code = up.wait(30)
    assert code == 1, up.text()  # `experiment run` exits 1 when the experiment ends STOPPED
    assert gone(trials.values(), 1) and gone(stack.values(), 1) and ports_free(home.ports)
    state = asyncio.run(recorded(home.data_dir / "nats", "experiments", experiment))
    assert state["status"] == "STOPPED"
