"""The remote agent (``services/adapters/remote/agent.py``) as the adapter drives it, over
its stdin and stdout, on this host: what every SSH machine runs."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from services.adapters.remote.client import AGENT_PATH
from services.trial_keeper import KEEPER_PATH, WARM_FILES

pytestmark = pytest.mark.timeout(60)


class Agent:
    def __init__(self, tmp_path: Path) -> None:
        bundle = tmp_path / "bin"
        bundle.mkdir()
        shutil.copy(AGENT_PATH, bundle / "agent.py")
        shutil.copy(KEEPER_PATH, bundle / "trial_keeper.py")
        for name, path in WARM_FILES.items():
            shutil.copy(path, bundle / name)
        self.root = tmp_path / "root"
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-I", str(bundle / "agent.py"), str(self.root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        self.ready = json.loads(self.proc.stdout.readline())["ready"]
        self.events: list[dict] = []
        self.ids = 0

    def call(self, op: str, **args):
        self.ids += 1
        self.proc.stdin.write(json.dumps({"id": self.ids, "op": op, **args}).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            message = json.loads(self.proc.stdout.readline())
            if "event" in message:
                self.events.append(message)
                continue
            assert message["id"] == self.ids
            return message

    def trial_dir(self, name: str) -> str:
        return f"{self.root}/trials/exp1/{name}-0"

    def launch(self, name: str, command: str, warm: bool = False, **env: str) -> dict:
        env = {"TRIALBUS_TRIAL_COMMAND": command, "TRIALBUS_EXPERIMENT_ID": "exp1", "TRIALBUS_TRIAL_ID": name,
               "PATH": os.environ["PATH"], **env}  # fmt: skip
        return self.call("launch", dir=self.trial_dir(name), env=env, files={"token": "t0ken"}, warm=warm)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def agent(tmp_path: Path):
    agent = Agent(tmp_path)
    yield agent
    agent.close()


def wait_state(agent: Agent, name: str, key: str, timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = agent.call("status", dirs=[agent.trial_dir(name)])["result"][agent.trial_dir(name)]
        if key in (status["state"] or {}):
            return status
        time.sleep(0.05)
    raise AssertionError(f"no {key} in the state of {name}")


def test_launch_is_idempotent_and_the_exit_is_pushed(agent):
    assert agent.ready["root"] == str(agent.root) and agent.ready["cpus"] >= 1
    first = agent.launch("t1", "sh -c 'echo hello; exit 3'")
    assert first["result"]["pid"] > 0
    assert agent.launch("t1", "true")["result"] == {"exists": True}, "a second launch never runs it twice"
    status = wait_state(agent, "t1", "exitCode")
    assert status["state"]["exitCode"] == 3
    deadline = time.monotonic() + 10
    while not any(e["event"] == "exit" for e in agent.events) and time.monotonic() < deadline:
        agent.call("status", dirs=[])  # events arrive between answers
    assert {"event": "exit", "dir": agent.trial_dir("t1")} in agent.events
    assert agent.call("tail", dir=agent.trial_dir("t1"), max=100)["result"]["stdout"] == "hello\n"
    token = Path(agent.trial_dir("t1")) / ".trialbus" / "token"
    assert token.read_text() == "t0ken" and token.stat().st_mode & 0o077 == 0, "the token file is private"


def test_python_trials_fork_from_the_machines_warm_template(agent, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "t.py").write_text("import sys, json\nprint('args', sys.argv[1:], 'json' in sys.modules)\nsys.exit(4)\n")
    first = agent.launch("w1", f"{sys.executable} t.py a", warm=True, TRIALBUS_CODE_DIR=str(code))
    cold = agent.launch("c1", f"{sys.executable} t.py a", warm=False, TRIALBUS_CODE_DIR=str(code))
    assert first["result"]["warm"] is True and cold["result"]["warm"] is False
    for name in ("w1", "c1"):
        assert wait_state(agent, name, "exitCode")["state"]["exitCode"] == 4
        assert Path(agent.trial_dir(name), "stdout").read_text() == "args ['a'] True\n" or name == "c1"
    assert json.loads(Path(agent.trial_dir("w1"), ".trialbus/state.json").read_text())["warm"] is True
    assert Path(agent.trial_dir("c1"), "stdout").read_text().startswith("args ['a']")
    # Not a Python script: cold, as always
    assert agent.launch("s1", "sh -c 'exit 0'", warm=True)["result"]["warm"] is False
    assert wait_state(agent, "s1", "exitCode")["state"]["exitCode"] == 0


def test_signal_stops_the_trial_and_list_and_report_drive_adoption(agent):
    agent.launch("t2", "sleep 60")
    status = wait_state(agent, "t2", "pgid")
    assert status["alive"] is True
    listed = agent.call("list")["result"]
    assert [(e["trial"], e["attempt"], e["state"]["pgid"]) for e in listed] == [("t2", 0, status["state"]["pgid"])]
    assert agent.call("signal", dir=agent.trial_dir("t2"), signal=signal.SIGTERM)["result"] == {"sent": True}
    status = wait_state(agent, "t2", "done")
    assert status["state"]["canceled"] is True
    # the keeper writes its end, then exits: "alive" may lag the state by a moment (seen once on a loaded host)
    deadline = time.monotonic() + 5
    while status["alive"] and time.monotonic() < deadline:
        time.sleep(0.05)
        status = agent.call("status", dirs=[agent.trial_dir("t2")])["result"][agent.trial_dir("t2")]
    assert status["alive"] is False
    agent.call("report", dir=agent.trial_dir("t2"))
    assert agent.call("list")["result"] == [], "a reported trial is not adopted again"


def test_spooled_batches_come_back_in_order_once_one_is_stuck(agent):
    agent.launch("t3", "true")
    wait_state(agent, "t3", "exitCode")
    spool = Path(agent.trial_dir("t3")) / ".trialbus" / "spool"
    spool.mkdir()
    for n, record in enumerate(['{"a": 1}', '{"b": 2}'], start=1):
        data = record.encode() + b"\n"
        (spool / f"{n:08d}").write_bytes(b"ME%06d" % len(data) + data)
    os.utime(spool / "00000002", (time.time() - 30, time.time() - 30))  # the second is old, the first fresh
    found = agent.call("spool", dir=agent.trial_dir("t3"), minAge=10)["result"]
    assert found == {"files": [["00000001", ['{"a": 1}']], ["00000002", ['{"b": 2}']]], "token": "t0ken"}
    os.utime(spool / "00000002")
    assert agent.call("spool", dir=agent.trial_dir("t3"), minAge=10)["result"]["files"] == []
    agent.call("unspool", dir=agent.trial_dir("t3"), names=["00000001", "00000002"])
    assert list(spool.iterdir()) == []


def test_paths_outside_the_root_and_unsafe_archives_are_refused(agent, tmp_path):
    reply = agent.call("launch", dir=str(tmp_path / "elsewhere"), env={"TRIALBUS_TRIAL_COMMAND": "true"})
    assert "is not a trial directory under" in reply["error"]
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(evil.getvalue())
    reply = agent.call("unpack", archive=str(archive), dest=str(agent.root / "code" / "abc"))
    assert "is not a plain file inside it" in reply["error"]
    assert not (agent.root / "code" / "abc").exists() and not (tmp_path / "escape.py").exists()
    assert not archive.exists(), "the uploaded archive is removed either way"
