"""Checkpoints that follow a remote trial to another machine (issue 22), as a user sees it.

Both "machines" are sshd servers on this host that log in one user, so they share its home
and the remote root in it. So that the retry on the second machine can only resume from the
copy in the object store, each test removes the checkpoint directory from that shared disk
once the first machine is gone: what the retry finds there, the adapter brought.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import textwrap
from contextlib import suppress
from pathlib import Path

import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.e2e.test_remote import machine, remote_config, remote_root, start_stack  # noqa: F401 - a fixture
from tests.fixtures.sshd import ssh_user

pytestmark = pytest.mark.timeout(120)

#: Attempt 0 saves step 7 (and ``weights`` random bytes) in its checkpoint directory, says on
#: which machine it runs, and hangs (or exits with ``exit``); a later attempt reports the step it
#: finds (None: none).
TRIAL = textwrap.dedent(
    """
    import json, os, sys, time
    import nni, trialbus_trial

    params = nni.get_next_parameter()
    port = int(os.environ["SSH_CONNECTION"].split()[3])
    saved = trialbus_trial.checkpoint_dir() / "step.json"
    if trialbus_trial.attempt() == 0:
        (trialbus_trial.checkpoint_dir() / "weights.bin").write_bytes(os.urandom(params["weights"]))
        with open(f"{saved}.tmp", "w") as f:
            json.dump({"step": 7}, f)
        os.rename(f"{saved}.tmp", saved)
        with open(os.path.join(os.environ["NNI_OUTPUT_DIR"], "port"), "w") as f:
            f.write(str(port))
        if params.get("exit"):
            sys.exit(params["exit"])
        time.sleep(300)
    resumed = json.loads(saved.read_text())["step"] if saved.exists() else None
    nni.report_final_result({"default": resumed or 0, "resumed": resumed, "port": port})
    """
)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    return write_code(tmp_path, TRIAL)


@pytest.fixture
def stack(tmp_path, nats_server, sshd_pair, remote_root, stacks):  # noqa: F811 - remote_root is the fixture
    stacks.append(start_stack(tmp_path, nats_server, sshd_pair, remote_root, TRIALBUS_UNREACHABLE_TIMEOUT="3"))
    yield stacks[-1]
    for state in (ssh_user().home / remote_root / "trials").glob("*/*/.trialbus/state.json"):
        stop_left_behind(json.loads(state.read_text()))  # attempt 0, on the machine that went away


def stop_left_behind(state: dict) -> None:
    """What an unreachable machine's trial leaves running (its keeper and its process group)."""
    for kill, pid in ((os.killpg, state.get("pgid")), (os.kill, state.get("keeperPid"))):
        if pid:
            with suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def experiment_with(stack, code: Path, sshd_pair, ssh_key, retry: dict | None = None, **sync) -> str:
    config = remote_config(code, [machine(s, ssh_key) for s in sshd_pair], retry=retry or {"backoff": "0s"})
    config["trainingService"]["checkpointSync"] = {"interval": "1s", **sync}
    return create(stack, config)


def first_attempt_running(stack, experiment: str, trial_id: str, remote_root: str, sshd_pair):  # noqa: F811
    """The machine attempt 0 runs on, once its checkpoint is saved, and the other one."""
    port_file = ssh_user().home / remote_root / "trials" / experiment / f"{trial_id}-0" / "port"
    port = int(wait_until(lambda: port_file.exists() and port_file.read_text(), 30, "attempt 0 to save its step"))
    return sorted(sshd_pair, key=lambda server: server.port != port)


def remove_from_shared_disk(experiment: str, trial_id: str, remote_root: str) -> None:  # noqa: F811
    shutil.rmtree(ssh_user().home / remote_root / "checkpoints" / experiment / trial_id)


def test_a_retry_on_another_machine_resumes_from_the_checkpoint_copied_through_the_bus(
    stack,
    code,
    sshd_pair,
    ssh_key,
    remote_root,  # noqa: F811
):
    # Given a trial that saved step 7 in its checkpoint directory on one machine, and hangs there
    experiment = experiment_with(stack, code, sshd_pair, ssh_key)
    trial_id = submit(stack, experiment, {"weights": 200_000})
    first, second = first_attempt_running(stack, experiment, trial_id, remote_root, sshd_pair)
    wait_until(
        lambda: f"saved the checkpoint of trial {trial_id} (attempt 0)" in stack.log("remote"),
        15,
        "the checkpoint to be copied to the object store",
    )
    # When that machine goes away, with its disk
    first.stop()
    remove_from_shared_disk(experiment, trial_id, remote_root)
    # Then the attempt fails as infrastructure, and its retry runs on the other machine from step 7
    done = ended(stack, trial_id, timeout=60)
    assert done["status"] == "SUCCEEDED", done
    assert done["finalMetric"] == {"default": 7, "resumed": 7, "port": second.port}
    [lost] = done["attempts"]
    assert (lost["attempt"], lost["status"], lost["failure"]) == (0, "FAILED", "infrastructure"), lost
    assert f"restored the checkpoint of trial {trial_id}, saved by attempt 0 on " in stack.log("remote")


def test_a_checkpoint_over_max_size_is_not_copied_and_the_retry_starts_from_scratch(
    stack,
    code,
    sshd_pair,
    ssh_key,
    remote_root,  # noqa: F811
):
    # Given a trial whose checkpoint directory holds 2 MiB, over its experiment's 1 MiB
    experiment = experiment_with(stack, code, sshd_pair, ssh_key, maxSize="1mb")
    trial_id = submit(stack, experiment, {"weights": 2 * 1024 * 1024})
    first, second = first_attempt_running(stack, experiment, trial_id, remote_root, sshd_pair)
    warning = f"the checkpoint directory of trial {trial_id} on "
    wait_until(lambda: warning in stack.log("remote"), 15, "the adapter to say why it does not copy it")
    # When its machine goes away
    first.stop()
    remove_from_shared_disk(experiment, trial_id, remote_root)
    # Then the retry on the other machine finds no checkpoint: nothing was copied
    done = ended(stack, trial_id, timeout=60)
    assert done["status"] == "SUCCEEDED", done
    assert done["finalMetric"] == {"default": 0, "resumed": None, "port": second.port}
    assert done["attempts"][0]["failure"] == "infrastructure"
    log = stack.log("remote")
    said = [line for line in log.splitlines() if warning in line]
    assert len(said) == 1 and "over checkpointSync.maxSize (1 MiB)" in said[0] and "WARNING" in said[0], said
    assert f"saved the checkpoint of trial {trial_id}" not in log and "restored the checkpoint" not in log


def test_the_checkpoint_an_attempt_leaves_at_its_end_is_copied_before_its_retry(
    stack,
    code,
    sshd_pair,
    ssh_key,
    remote_root,  # noqa: F811
):
    # Given a trial retried after its own failure, whose checkpoint is looked at only every minute
    experiment = experiment_with(stack, code, sshd_pair, ssh_key, retry={"trial": 1, "backoff": "3s"}, interval="60s")
    # When its first attempt saves step 7 and exits 1 at once
    trial_id = submit(stack, experiment, {"weights": 1000, "exit": 1})
    first, second = first_attempt_running(stack, experiment, trial_id, remote_root, sshd_pair)
    wait_until(lambda: trial(stack, trial_id)["attempts"], 15, "attempt 0 to end")
    # (and its machine goes away while the retry waits out its back-off)
    first.stop()
    remove_from_shared_disk(experiment, trial_id, remote_root)
    # Then its checkpoint was copied before its end was reported, and the retry resumes from it
    assert f"saved the checkpoint of trial {trial_id} (attempt 0)" in stack.log("remote")
    done = ended(stack, trial_id, timeout=60)
    assert done["status"] == "SUCCEEDED", done
    assert done["finalMetric"] == {"default": 7, "resumed": 7, "port": second.port}
    assert done["attempts"][0]["failure"] == "trial"
    # and the first attempt's log went with its machine, which the answer says
    gone = stack.rest("GET", f"/trials/{trial_id}/log?attempt=0")
    assert "the trial's log cannot be read: machine" in gone.text and "unreachable" in gone.text, gone.text
