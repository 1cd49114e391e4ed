"""What the adapter reads and signals of a trial that runs as another user, who owns its directory
and writes its ``state.json``: no link, FIFO or hard link in it leads the adapter elsewhere, and a
process group it names is signalled only where its processes are that user's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from services.adapters import trialdir
from services.adapters.local_gpu import client
from services.adapters.local_gpu.users import TrialUser, TrialUserError, TrialUsers


@pytest.fixture
def trial(tmp_path: Path) -> Path:
    (tmp_path / "t-0" / ".trialbus").mkdir(parents=True)
    return tmp_path / "t-0"


def test_links_fifos_and_hard_links_in_a_trial_directory_are_not_read(trial: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"keeperPid": 1, "exitCode": 0}')
    (trial / trialdir.STATE).symlink_to(secret)
    assert client.read_state(str(trial)) == {}
    (trial / trialdir.STATE).unlink()
    os.link(secret, trial / trialdir.STATE)
    assert client.read_state(str(trial)) == {}
    (trial / trialdir.STATE).unlink()
    os.mkfifo(trial / "stdout")  # would block a plain open for ever
    assert client.tail(str(trial), "stdout", 100) is None
    # a link for the whole .trialbus folder leads nowhere either
    (trial / ".trialbus").rename(trial / "elsewhere")
    (trial / ".trialbus").symlink_to(trial / "elsewhere")
    (trial / "elsewhere" / "state.json").write_text('{"exitCode": 3}')
    assert client.read_state(str(trial)) == {}
    with pytest.raises(OSError):
        trialdir.mark_reported(str(trial))
    assert not (trial / "elsewhere" / "reported").exists()


def test_a_trial_writes_and_the_adapter_reads_its_own_files(trial: Path) -> None:
    (trial / trialdir.STATE).write_text('{"exitCode": 0}')
    (trial / "stdout").write_text("a" * 50 + "end")
    assert client.read_state(str(trial)) == {"exitCode": 0}
    assert client.tail(str(trial), "stdout", 3) == "end"
    client.record_early_death(str(trial), 12, None)
    assert client.read_state(str(trial)) == {"keeperPid": 12, "keeperExit": None}


def test_a_group_is_signalled_only_where_its_processes_are_the_trial_users() -> None:
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        other = os.geteuid() + 1
        client.kill_group(sleeper.pid, signal.SIGKILL, uid=other)
        time.sleep(0.2)
        assert sleeper.poll() is None  # not that user's: left alone
        client.kill_group(sleeper.pid, signal.SIGKILL, uid=os.geteuid())
        assert sleeper.wait(5) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_start_fails_when_the_trial_user_cannot_reach_the_work_dir() -> None:
    users = TrialUsers("auto")
    users.user = TrialUser("someone", os.geteuid() + 4321, os.getegid() + 4321, (), switch=True)
    private = Path(tempfile.mkdtemp(prefix="trialbus-reach-"))  # 0700, in /tmp (pytest's own folders are private)
    try:
        (private / "data").mkdir()
        with pytest.raises(TrialUserError, match=f"cannot pass through {private} "):
            users.check_reachable(str(private / "data"))
        private.chmod(0o711)
        users.check_reachable(str(private / "data"))
    finally:
        shutil.rmtree(private)


def test_a_keeper_pid_from_a_trials_state_is_adopted_only_when_it_is_the_trial_users() -> None:
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "trial_keeper"])
    try:
        wait_for = time.monotonic() + 5
        while not client.is_keeper(fake.pid) and time.monotonic() < wait_for:
            time.sleep(0.05)
        assert client.Keeper.adopt(fake.pid, uid=os.geteuid() + 1) is None  # another user's process
        adopted = client.Keeper.adopt(fake.pid, uid=os.geteuid())
        assert adopted is not None
        adopted.close()
    finally:
        fake.kill()
        fake.wait()


def test_the_adapter_does_not_start_with_a_trial_user_it_cannot_use(nats_server, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env.update(
        TRIALBUS_NATS_URL=nats_server.url,
        TRIALBUS_DATA_DIR=str(tmp_path / "data"),
        TRIALBUS_TRIAL_USER="trialbus-no-such-user",
        TRIALBUS_STOP_TIMEOUT="5",
    )
    done = subprocess.run(
        [sys.executable, "-m", "services.adapters.local_gpu"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "TRIALBUS_TRIAL_USER=trialbus-no-such-user: there is no such user on this host" in done.stderr + done.stdout
