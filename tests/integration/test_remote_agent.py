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

from services.adapters.remote.client import AGENT_FILES
from services.trial_keeper import KEEPER_PATH, WARM_FILES

pytestmark = pytest.mark.timeout(60)


class Agent:
    def __init__(self, tmp_path: Path) -> None:
        bundle = tmp_path / "bin"
        bundle.mkdir()
        shutil.copy(KEEPER_PATH, bundle / "trial_keeper.py")
        for name, path in {**AGENT_FILES, **WARM_FILES}.items():
            shutil.copy(path, bundle / name)
        self.root = tmp_path / "root"
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-I", str(bundle / "agent.py"), str(self.root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
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
        env = {
            "TRIALBUS_TRIAL_COMMAND": command,
            "TRIALBUS_EXPERIMENT_ID": "exp1",
            "TRIALBUS_TRIAL_ID": name,
            "PATH": os.environ["PATH"],
            **env,
        }
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


def checkpoint_archive(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for info, content in members:
            info.size = len(content) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(content) if info.isfile() else None)
    path = agent_tmp(tmp_path) / f"restore-{len(list(agent_tmp(tmp_path).iterdir()))}"
    path.write_bytes(data.getvalue())
    return path


def agent_tmp(tmp_path: Path) -> Path:
    (tmp_path / "root" / "tmp").mkdir(exist_ok=True)
    return tmp_path / "root" / "tmp"


def test_a_checkpoint_directory_is_signed_packed_and_unpacked_elsewhere(agent, tmp_path):
    # Given a trial's checkpoint directory with a file, a sub-directory and a link out of it
    source = agent.root / "checkpoints" / "exp1" / "t5"
    (source / "shards").mkdir(parents=True)
    (source / "step.json").write_text('{"step": 7}')
    (source / "shards" / "0.bin").write_bytes(b"w" * 5000)
    (source / "passwd").symlink_to("/etc/passwd")
    agent.launch("t5", "true")
    # When the status read asks for its signature, it counts its files, not the link
    status = agent.call("status", dirs=[agent.trial_dir("t5")], checkpoints={agent.trial_dir("t5"): str(source)})
    signature = status["result"][agent.trial_dir("t5")]["checkpoint"]
    assert signature[1:] == [5011, 2, 1]  # bytes, files, directories
    # and packing writes an archive once, then says unchanged, or too big for the cap
    archive = agent_tmp(tmp_path) / "pack-1"
    packed = agent.call("checkpoint_pack", dir=str(source), archive=str(archive), maxBytes=10_000)["result"]
    assert packed == {"signature": signature, "size": archive.stat().st_size}
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["shards", "shards/0.bin", "step.json"], "the link is left out"
    again = agent.call("checkpoint_pack", dir=str(source), archive=str(archive) + "x", maxBytes=10_000, since=signature)
    assert again["result"] == {"signature": signature, "unchanged": True}
    over = agent.call("checkpoint_pack", dir=str(source), archive=str(archive) + "y", maxBytes=5000)
    assert over["result"] == {"signature": signature, "over": True} and not Path(str(archive) + "y").exists()
    # Then unpacking it for another trial's directory replaces what was there
    dest = agent.root / "checkpoints" / "exp1" / "t6"
    dest.mkdir(parents=True)
    (dest / "stale").write_text("old")
    found = agent.call("checkpoint_unpack", dir=str(dest), archive=str(archive), maxBytes=10_000)["result"]
    assert (dest / "step.json").read_text() == '{"step": 7}' and (dest / "shards" / "0.bin").stat().st_size == 5000
    assert not (dest / "stale").exists() and not archive.exists()
    assert found["signature"][1:] == [5011, 2, 1]
    scan = agent.call("checkpoint_scan", dir=str(dest), experiment="exp1", trial="t5")["result"]
    assert scan == {"signature": found["signature"], "attempt": 0}, "attempt 0 of t5 ran here"


def member(name: str, content: bytes = b"x", link: str | None = None) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    return info, content


@pytest.mark.parametrize(
    ("unsafe", "refusal"),
    [
        (member("../escape"), "would land outside the checkpoint directory"),
        (member("/etc/cron.d/x"), "would land outside the checkpoint directory"),
        (member("passwd", b"", link="/etc/passwd"), "is not a regular file or directory to '/etc/passwd'"),
        (member("big", b"x" * 2048), "takes it past 1024 bytes of files"),
    ],
)
def test_an_unsafe_checkpoint_archive_changes_nothing(agent, tmp_path, unsafe, refusal):
    dest = agent.root / "checkpoints" / "exp1" / "t7"
    dest.mkdir(parents=True)
    (dest / "step.json").write_text("kept")
    archive = checkpoint_archive(tmp_path, member("ok.txt", b"fine"), unsafe)
    reply = agent.call("checkpoint_unpack", dir=str(dest), archive=str(archive), maxBytes=1024)
    assert refusal in reply["error"], reply
    assert [p.name for p in dest.parent.iterdir()] == ["t7"] and [p.name for p in dest.iterdir()] == ["step.json"]
    assert not (agent.root / "checkpoints" / "escape").exists() and not archive.exists()
    outside = agent.call("checkpoint_unpack", dir=str(tmp_path / "elsewhere"), archive=str(archive), maxBytes=1024)
    assert "is not a checkpoint directory under" in outside["error"]


def test_an_attempts_directory_is_found_by_number_or_the_newest(agent):
    """After a restart the adapter asks the machine for a finished trial's log: the newest
    attempt, or the one the user names (`trialbus trial log ID --attempt N`)."""
    for attempt in (0, 2):
        Path(f"{agent.root}/trials/exp1/tf-{attempt}").mkdir(parents=True)

    def find(**args) -> dict | None:
        return agent.call("find", experiment="exp1", trial="tf", **args)["result"]

    assert find()["attempt"] == 2 and find(attempt=None)["attempt"] == 2
    assert find(attempt=0) == {"attempt": 0, "dir": f"{agent.root}/trials/exp1/tf-0"}
    assert find(attempt=1) is None


def test_clean_removes_old_checkpoints_but_those_of_trials_still_running(agent):
    """A machine keeps checkpoint directories as long as finished trials' directories (retention),
    never those of a trial that still runs there, however long it has not written one."""
    old = time.time() - 3600
    trials, checkpoints = Path(agent.root, "trials", "exp1"), Path(agent.root, "checkpoints", "exp1")
    for trial, reported in (("done", True), ("runs", False)):
        (trials / f"{trial}-0").mkdir(parents=True)
        if reported:
            (trials / f"{trial}-0" / ".trialbus").mkdir()
            (trials / f"{trial}-0" / ".trialbus" / "reported").touch()
            os.utime(trials / f"{trial}-0" / ".trialbus" / "reported", (old, old))
    for trial in ("done", "runs", "fresh"):
        (checkpoints / trial).mkdir(parents=True)
        (checkpoints / trial / "model.pt").write_bytes(b"weights")
        if trial != "fresh":
            os.utime(checkpoints / trial, (old, old))

    found = agent.call("clean", retention=60)["result"]

    assert found == {"removed": 1, "checkpoints": 1}
    assert sorted(p.name for p in checkpoints.iterdir()) == ["fresh", "runs"]
    assert sorted(p.name for p in trials.iterdir()) == ["runs-0"]
