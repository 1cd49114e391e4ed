"""Retries on SSH machines (issue 22) beyond a lost machine (``test_remote_checkpoints.py``):
a silent trial is declared lost and run again; a drained replica's trial is preempted,
saves its checkpoint in its grace period and resumes on the other replica; a trial's own
failure is retried only when the experiment asks. Real sshd, real
keepers on the machines, the stack's own processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import suppress
from pathlib import Path

import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.e2e.test_remote import machine, remote_config, remote_root, start_stack  # noqa: F401 - a fixture
from tests.fixtures.sshd import ssh_user

pytestmark = pytest.mark.timeout(120)

TRIALBUS = str(Path(sys.executable).parent / "trialbus")

#: Attempt 0 counts steps, saving the next one in its checkpoint directory after each; on
#: SIGTERM it takes 1.5 s to save (more than the stack's 1 s default kill grace) and exits.
#: With ``exit``, attempt 0 exits so at once. A later attempt reports the step it resumed from.
TRIAL = textwrap.dedent(
    """
    import os, signal, sys, time
    import nni, trialbus_trial

    params = nni.get_next_parameter()
    saved = trialbus_trial.checkpoint_dir() / "next-step"
    start = int(saved.read_text()) if saved.exists() else 0
    if trialbus_trial.attempt() > 0:
        nni.report_final_result({"default": start, "attempt": trialbus_trial.attempt()})
        sys.exit(0)
    if params.get("exit"):
        sys.exit(params["exit"])
    step = 0

    def on_term(signum, frame):
        time.sleep(1.5)
        saved.write_text(str(step))
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        step += 1
        nni.report_intermediate_result(step)
        if step == 3:
            saved.write_text("3")
        time.sleep(0.05)
    """
)


@pytest.fixture
def stack(tmp_path, nats_server, sshd_pair, remote_root, stacks):  # noqa: F811 - remote_root is the fixture
    stacks.append(start_stack(tmp_path, nats_server, sshd_pair[:1], remote_root))
    yield stacks[-1]
    for state in (ssh_user().home / remote_root / "trials").glob("*/*/.trialbus/state.json"):
        found = json.loads(state.read_text())
        for kill, pid in ((os.killpg, found.get("pgid")), (os.kill, found.get("keeperPid"))):
            if pid:
                with suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGCONT)
                    kill(pid, signal.SIGKILL)


def experiment(stack, tmp_path: Path, sshd_pair, ssh_key, **overrides) -> str:
    tmp_path.mkdir(exist_ok=True)
    code = write_code(tmp_path, TRIAL)
    return create(stack, remote_config(code, [machine(sshd_pair[0], ssh_key)], **overrides))


def keeper_state(remote_root: str, experiment_id: str, trial_id: str) -> dict:  # noqa: F811
    path = ssh_user().home / remote_root / "trials" / experiment_id / f"{trial_id}-0" / ".trialbus" / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_silent_remote_trial_is_lost_stopped_and_run_again(
    stack,
    tmp_path,
    sshd_pair,
    ssh_key,
    remote_root,  # noqa: F811
):
    # Given a remote experiment that declares a trial lost after 3 s without a sign of its keeper
    experiment_id = experiment(stack, tmp_path, sshd_pair, ssh_key, retry={"heartbeatTimeout": "3s", "backoff": "0s"})
    trial_id = submit(stack, experiment_id, {})
    wait_until(lambda: trial(stack, trial_id)["intermediateCount"] >= 3, 30, "attempt 0 to report 3 steps")
    first = keeper_state(remote_root, experiment_id, trial_id)
    # When its keeper on the machine hangs (alive, silent) while the trial runs on
    os.kill(first["keeperPid"], signal.SIGSTOP)
    # Then it is declared lost, stopped, and run again from its checkpoint
    done = ended(stack, trial_id, timeout=60)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    [lost] = done["attempts"]
    assert lost["failure"] == "lost" and "no sign of life" in lost["message"], lost
    assert done["finalMetric"]["default"] >= 3  # resumed from what attempt 0 saved
    wait_until(lambda: not _running(first["trialPid"]), 15, "the lost attempt's trial to be gone")


def test_a_drained_remote_replica_preempts_its_trial_which_saves_in_its_grace_period_and_resumes(
    stack,
    tmp_path,
    sshd_pair,
    ssh_key,
    remote_root,  # noqa: F811
):
    # Given two remote adapter replicas and a trial running through one of them
    stack.start("remote@b")
    experiment_id = experiment(stack, tmp_path, sshd_pair, ssh_key, trialGracePeriod="4s", retry={"backoff": "0s"})
    trial_id = submit(stack, experiment_id, {})
    running = wait_until(
        lambda: (t := trial(stack, trial_id))["intermediateCount"] >= 3 and t, 30, "attempt 0 to report 3 steps"
    )
    # When its replica is drained
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}
    drained = subprocess.run(
        [TRIALBUS, "platform", "drain", "remote", running["replica"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert drained.returncode == 0 and "1 trial(s) preempted" in drained.stdout, drained.stdout + drained.stderr
    # Then the trial got SIGTERM, saved its step in its grace period, and ran again through the other replica
    done = ended(stack, trial_id, timeout=60)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    [preempted] = done["attempts"]
    assert (preempted["status"], preempted["failure"], preempted["replica"]) == (
        "PREEMPTED",
        "preempted",
        running["replica"],
    ), preempted
    assert done["replica"] != running["replica"]
    assert done["finalMetric"]["default"] > 3  # saved while stopping, after the step-3 checkpoint


def test_a_remote_trial_failing_on_its_own_is_retried_only_when_the_experiment_asks(
    stack,
    tmp_path,
    sshd_pair,
    ssh_key,
    remote_root,  # noqa: F811
):
    plain = experiment(stack, tmp_path / "plain", sshd_pair, ssh_key)
    asked = experiment(stack, tmp_path / "asked", sshd_pair, ssh_key, retry={"trial": 1, "backoff": "0s"})
    failing, retried = submit(stack, plain, {"exit": 3}), submit(stack, asked, {"exit": 3})
    # A trial's own failure ends it, as in NNI, when the experiment says nothing of retries
    failed = ended(stack, failing, timeout=60)
    assert (failed["status"], failed["attempt"], failed["exitCode"], failed["failure"]) == ("FAILED", 0, 3, "trial")
    assert failed["attempts"] == []
    # and runs again when `retry.trial` asks
    done = ended(stack, retried, timeout=60)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    assert [(a["status"], a["exitCode"], a["failure"]) for a in done["attempts"]] == [("FAILED", 3, "trial")]


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
