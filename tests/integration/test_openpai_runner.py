"""The reuse-mode environment runner as a real process, with the real trial keeper, driven
through the share the way the openpai adapter drives it (tickets, cancel markers, heartbeat)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.adapters import sharefs, trialdir
from services.adapters.openpai import jobs
from services.trial_keeper import KEEPER_PATH
from tests.e2e.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

RUNNER_PATH = Path(jobs.__file__).with_name("runner.py")


class Env:
    """An environment's folder, one task of it, and the trials handed to it."""

    def __init__(self, root: Path, orphan: float = 600.0) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        shutil.copy(RUNNER_PATH, self.bin / jobs.RUNNER)
        shutil.copy(KEEPER_PATH, self.bin / "trial_keeper.py")
        shutil.copy(trialdir.__file__, self.bin / "trialdir.py")
        self.dir, self.trials = root / "env", root / "trials"
        (self.dir / "tickets").mkdir(parents=True)
        (self.dir / "alive").touch()
        self.task = self.dir / "taskrole-0"
        self.task.mkdir()
        self.tickets = 0
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-S",
                "-I",
                str(self.bin / jobs.RUNNER),
                "--env",
                str(self.dir),
                "--task",
                str(self.task),
                "--command",
                str(self.task / "command.sh"),
                "--reports",
                "--poll",
                "0.05",
                "--orphan",
                str(orphan),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PAI_CURRENT_TASK_ROLE_NAME": "x"},
        )
        self.output = ""

    def command(self, text: str) -> None:
        (self.task / "command.sh").write_text(text)

    def trial(self, name: str, hand: bool = True) -> Path:
        folder = self.trials / name
        (folder / ".trialbus").mkdir(parents=True)
        for settings in ("report.env", "quiet.env"):
            (folder / ".trialbus" / settings).write_bytes(sharefs.settings_file({"TRIALBUS_TRIAL_ID": name}))
        if hand:
            self.hand(folder)
        return folder

    def hand(self, folder: Path) -> None:
        self.tickets += 1
        tmp = self.dir / f".{self.tickets}"
        tmp.write_text(str(folder))
        tmp.rename(self.dir / "tickets" / f"{self.tickets:020d}-{folder.name}-0")

    def stop(self) -> str:
        """Everything the runner printed (killed first if it still runs)."""
        if self.proc.poll() is None:
            self.proc.kill()
        if not self.proc.stdout.closed:
            self.output = self.proc.communicate()[0].decode()
        return self.output


@pytest.fixture
def env(tmp_path: Path):
    found = Env(tmp_path)
    yield found
    found.stop()


def state(folder: Path) -> dict:
    try:
        return json.loads((folder / "taskrole-0" / ".trialbus" / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def ended(folder: Path) -> dict:
    wait_until(lambda: state(folder).get("exitCode") is not None or state(folder).get("done"), 20, "the trial's end")
    return state(folder)


def test_trials_run_one_after_another_in_ticket_order(env):
    env.command('echo "$NNI_TRIAL_JOB_ID $(date +%s%N)" >> "$NNI_SYS_DIR/../../order"\n')
    first, second = env.trial("a"), env.trial("b")
    assert ended(first)["exitCode"] == 0 and ended(second)["exitCode"] == 0
    order = (env.trials / "order").read_text().split()
    assert order[0::2] == ["a", "b"], order
    assert int(order[1]) < int(order[3]), order


def test_a_cancel_before_the_start_skips_the_trial_and_during_it_stops_it(env):
    env.command('touch "$NNI_SYS_DIR/ran"; exec sleep 30\n')
    skipped = env.trial("skipped", hand=False)
    (skipped / ".trialbus" / "cancel").touch()
    env.hand(skipped)
    assert ended(skipped) == {**state(skipped), "done": True, "canceled": True}
    assert not (skipped / "taskrole-0" / "ran").exists(), "a canceled trial never starts"
    running = env.trial("running")
    wait_until(lambda: (running / "taskrole-0" / "ran").exists(), 20, "the trial started")
    (running / ".trialbus" / "cancel").touch()
    assert ended(running)["exitCode"] == -signal.SIGTERM
    after = env.trial("after")
    wait_until(lambda: (after / "taskrole-0" / "ran").exists(), 20, "the next trial runs in the same environment")


def test_a_trial_begun_before_the_environment_restarted_is_never_run_twice(env):
    env.command('touch "$NNI_SYS_DIR/ran"\n')
    folder = env.trial("begun", hand=False)
    (folder / "taskrole-0" / ".trialbus").mkdir(parents=True)  # a previous run of the job claimed it
    env.hand(folder)
    wait_until(lambda: state(folder).get("error"), 20, "an error in state.json")
    assert "interrupted" in state(folder)["error"] and "environment restarted" in state(folder)["error"]
    assert not (folder / "taskrole-0" / "ran").exists()


def test_a_stopped_job_stops_its_trial_and_says_so(env):
    env.command('touch "$NNI_SYS_DIR/ran"; exec sleep 30\n')
    folder = env.trial("stopped")
    wait_until(lambda: (folder / "taskrole-0" / "ran").exists(), 20, "the trial started")
    env.proc.send_signal(signal.SIGTERM)
    assert env.proc.wait(20) == 128 + signal.SIGTERM
    assert ended(folder)["exitCode"] == -signal.SIGTERM
    assert (folder / "taskrole-0" / ".trialbus" / "environment-stopped").exists()


def test_a_runner_without_word_from_its_adapter_leaves(tmp_path):
    env = Env(tmp_path, orphan=0.5)
    try:
        started = time.monotonic()
        assert env.proc.wait(20) == 0
        assert time.monotonic() - started >= 0.5
        assert "no word from the adapter" in env.stop()
    finally:
        env.stop()
