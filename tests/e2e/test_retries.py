"""Trials that outlive what runs them (issue 22), on the local adapter, as a user sees it:
a trial whose keeper is taken away mid-run is retried and resumes from its checkpoint; a
trial that fails on its own is not retried unless the experiment asks; attempts show in the
API, the client and the CLI; ``trialbus trial retry`` starts a finished trial again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import config, write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.emulators.cloud_metadata import CloudMetadata
from trialbus.client import AsyncClient

pytestmark = pytest.mark.timeout(120)

TRIALBUS = str(Path(sys.executable).parent / "trialbus")

#: Counts ``steps``, saving the next step in its checkpoint directory after each one; a retry
#: starts from there. On attempt 0 it may stop at ``hang_at`` (touching ``flag``) or exit ``exit``.
TRIAL = textwrap.dedent(
    """
    import os, sys, time
    import nni, trialbus_trial

    params = nni.get_next_parameter()
    saved = trialbus_trial.checkpoint_dir() / "next-step"
    start = int(saved.read_text()) if saved.exists() else 0
    first = trialbus_trial.attempt() == 0
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"{nni.get_trial_id()} {trialbus_trial.attempt()} {start}\\n")
    print(f"attempt {trialbus_trial.attempt()} starts at step {start}", flush=True)
    for step in range(start, params["steps"]):
        nni.report_intermediate_result(step)
        saved.write_text(str(step + 1))
        if first and params.get("hang_at") == step:
            open(params["flag"], "w").close()
            time.sleep(300)
    if first and "exit" in params:
        sys.exit(params["exit"])
    nni.report_final_result({"default": start, "attempt": trialbus_trial.attempt()})
    """
)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    return write_code(tmp_path, TRIAL)


def attempts_of(run_log: Path, trial_id: str) -> list[tuple[int, int]]:
    """(attempt, first step) of each real run of the trial, in order."""
    lines = run_log.read_text().splitlines() if run_log.exists() else []
    return [(int(a), int(s)) for t, a, s in (line.split() for line in lines) if t == trial_id]


def keeper_pid(stack, experiment: str, trial_id: str, attempt: int) -> int:
    state = stack.root / "data" / "local-gpu" / "test-host" / "trials" / experiment / f"{trial_id}-{attempt}"
    return json.loads((state / ".trialbus" / "state.json").read_text())["keeperPid"]


def test_a_trial_whose_keeper_is_taken_away_is_retried_and_resumes_from_its_checkpoint(stack, code, run_log, tmp_path):
    # Given a trial that has done 3 of 6 steps (its checkpoint says so) and then hangs
    experiment = create(stack, config(code, retry={"backoff": "0s"}))
    flag = tmp_path / "hung"
    trial_id = submit(stack, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag)})
    wait_until(flag.exists, 30, "the first attempt to reach step 3")
    wait_until(lambda: trial(stack, trial_id)["intermediateCount"] == 3, 30, "its 3 results delivered")
    # When what runs it goes away (its keeper is killed -9, as with a machine that dies)
    os.kill(keeper_pid(stack, experiment, trial_id, 0), signal.SIGKILL)
    # Then it runs again as attempt 1, from step 3, and succeeds
    done = ended(stack, trial_id)
    assert done["status"] == "SUCCEEDED", done
    assert done["attempt"] == 1 and done["finalMetric"] == {"default": 3, "attempt": 1}
    assert attempts_of(run_log, trial_id) == [(0, 0), (1, 3)]
    # and the attempt that ended says how and why
    [first] = done["attempts"]
    assert first["attempt"] == 0 and first["status"] == "FAILED" and first["failure"] == "infrastructure"
    assert "keeper" in first["message"] and first["startTime"] and first["endTime"]
    # and each attempt's metrics are kept apart: 0, 1, 2 from the first; 3, 4, 5 from the second
    metrics = stack.rest("GET", f"/trials/{trial_id}/metrics").json()
    periodical = [(m["attempt"], m["sequence"], m["value"]) for m in metrics if m["type"] == "PERIODICAL"]
    assert sorted(periodical) == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 3), (1, 1, 4), (1, 2, 5)]
    assert done["intermediateCount"] == 3  # the attempt that finished


def test_a_trial_failing_on_its_own_is_retried_only_when_the_experiment_asks(stack, code, run_log):
    # Given two experiments whose trial exits 3 on its first attempt: one says nothing of retries
    plain = create(stack, config(code))
    asked = create(stack, config(code, retry={"trial": 1, "backoff": "0s"}))
    failing = submit(stack, plain, {"steps": 2, "exit": 3})
    retried = submit(stack, asked, {"steps": 2, "exit": 3})
    # Then the first ends FAILED, as NNI would, after one attempt
    failed = ended(stack, failing)
    assert (failed["status"], failed["attempt"], failed["exitCode"], failed["failure"]) == ("FAILED", 0, 3, "trial")
    assert failed["attempts"] == [] and attempts_of(run_log, failing) == [(0, 0)]
    # And the second runs again (from its checkpoint) and succeeds
    done = ended(stack, retried)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    assert [(a["status"], a["exitCode"], a["failure"]) for a in done["attempts"]] == [("FAILED", 3, "trial")]
    assert attempts_of(run_log, retried) == [(0, 0), (1, 2)]


def test_the_client_sees_a_retried_trial_end_once_with_the_last_attempt_s_result(stack, code, tmp_path):
    async def scenario() -> tuple:
        async with AsyncClient(stack.nats.url) as client:
            experiment = await client.create_experiment(config(code, retry={"trial": 2, "backoff": "0s"}))
            trial_state = await client.submit_trial(experiment, {"steps": 3, "exit": 5})
            outcome = await client.wait_trial(trial_state.id, timeout=60)
            statuses = []
            async for event in client.events(experiment, trial_state.id):
                statuses.append((event.attempt, event.status.value))
                if event.status.terminal and event.attempt == 1:
                    break
            return outcome, statuses

    outcome, statuses = asyncio.run(scenario())
    assert outcome.status.value == "SUCCEEDED" and outcome.final == {"default": 3, "attempt": 1}
    # the history keeps both attempts: the failure, the dispatcher's retry, the success
    assert (0, "FAILED") in statuses and (1, "WAITING") in statuses and statuses[-1] == (1, "SUCCEEDED")


def test_a_finished_trial_is_retried_by_hand_from_the_cli(stack, code, run_log):
    # Given a trial that failed on its own (no retry asked for)
    experiment = create(stack, config(code))
    trial_id = submit(stack, experiment, {"steps": 2, "exit": 4})
    assert ended(stack, trial_id)["status"] == "FAILED"
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([TRIALBUS, *args], env=env, capture_output=True, text=True, timeout=60)

    # When the user retries it
    done = cli("trial", "retry", trial_id)
    # Then its next attempt runs, from its checkpoint, and succeeds
    assert done.returncode == 0, done.stderr
    assert f"trial {trial_id}: attempt 1 WAITING" in done.stdout
    assert wait_until(lambda: trial(stack, trial_id)["status"] == "SUCCEEDED", 30, "the retry to succeed")
    assert attempts_of(run_log, trial_id) == [(0, 0), (1, 2)]
    shown = json.loads(cli("trial", "show", trial_id).stdout)
    assert shown["attempt"] == 1 and [a["status"] for a in shown["attempts"]] == ["FAILED"]
    # And each attempt's log can be read: the current one by default, an earlier one by number
    current, first = cli("trial", "log", trial_id), cli("trial", "log", trial_id, "--attempt", "0")
    assert "attempt 1 starts at step 2" in current.stdout and "attempt 0" not in current.stdout, current
    assert "attempt 0 starts at step 0" in first.stdout and "attempt 1" not in first.stdout, first
    assert "attempt 0 starts" in stack.rest("GET", f"/trials/{trial_id}/log?attempt=0").text
    beyond = cli("trial", "log", trial_id, "--attempt", "7")
    refusal = f"trial {trial_id} has no attempt 7: its attempts are 0 to 1"
    assert beyond.returncode != 0 and refusal in beyond.stdout + beyond.stderr, beyond
    # And a trial that is not over, or not there, is refused with why
    running = submit(stack, experiment, {"steps": 2, "hang_at": 0, "flag": "/dev/null"})
    wait_until(lambda: trial(stack, running)["status"] == "RUNNING", 30, "RUNNING")
    refused = stack.rest("POST", f"/trials/{running}/retry")
    assert refused.status_code == 409 and "only a trial that has ended" in refused.json()["error"]
    assert stack.rest("POST", "/trials/nosuch/retry").status_code == 404
    missing = cli("trial", "retry", "nosuch")
    assert missing.returncode != 0 and "not found" in missing.stdout + missing.stderr


def test_a_silent_trial_is_lost_stopped_and_run_again(stack, code, run_log, tmp_path):
    # Given an experiment that declares a trial lost after 3 s without a sign of life from its keeper
    experiment = create(stack, config(code, retry={"heartbeatTimeout": "3s", "backoff": "0s"}))
    flag = tmp_path / "hung"
    trial_id = submit(stack, experiment, {"steps": 4, "hang_at": 1, "flag": str(flag)})
    wait_until(flag.exists, 30, "the first attempt to reach step 2")
    wait_until(lambda: trial(stack, trial_id)["intermediateCount"] == 2, 30, "its 2 results delivered")
    state_file = stack.root / "data" / "local-gpu" / "test-host" / "trials" / experiment / f"{trial_id}-0"
    first = json.loads((state_file / ".trialbus" / "state.json").read_text())
    # When its keeper hangs (stopped: alive, but silent), while the trial itself runs on
    os.kill(first["keeperPid"], signal.SIGSTOP)
    try:
        # Then the trial is declared lost, its attempt stopped, and it runs again from its checkpoint
        done = ended(stack, trial_id, timeout=60)
    finally:
        if _alive(first["keeperPid"]):  # (killed, as it should be, unless the test failed)
            os.kill(first["keeperPid"], signal.SIGCONT)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    [lost] = done["attempts"]
    assert lost["failure"] == "lost" and "no sign of life" in lost["message"], lost
    assert attempts_of(run_log, trial_id) == [(0, 0), (1, 2)]
    # and nothing of the lost attempt runs on (the two never ran together for long: its group was killed)
    wait_until(lambda: not _alive(first["trialPid"]), 10, "the lost attempt's trial to be gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


#: Counts steps until stopped; on SIGTERM it takes 1.5 s to save its step (more than the stack's
#: default 1 s kill grace: only the experiment's trialGracePeriod lets it finish) and exits.
#: A later attempt reports the step it resumed from.
PREEMPTIBLE = textwrap.dedent(
    """
    import os, signal, sys, time
    import nni, trialbus_trial

    params = nni.get_next_parameter()
    saved = trialbus_trial.checkpoint_dir() / "next-step"
    start = int(saved.read_text()) if saved.exists() else 0
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"{nni.get_trial_id()} {trialbus_trial.attempt()} {start}\\n")
    if trialbus_trial.attempt() > 0:
        nni.report_final_result({"default": start, "attempt": trialbus_trial.attempt()})
        sys.exit(0)
    step = 0

    def on_term(signum, frame):
        time.sleep(1.5)
        saved.write_text(str(step))
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        step += 1
        nni.report_intermediate_result(step)
        time.sleep(0.05)
    """
)


def test_a_drained_replica_preempts_its_trial_which_saves_in_its_grace_period_and_runs_elsewhere(
    stack, tmp_path, run_log
):
    # Given two local adapter replicas, and a trial running on one of them
    stack.start("adapter@b")
    code = write_code(tmp_path / "preemptible", PREEMPTIBLE) if (tmp_path / "preemptible").mkdir() is None else None
    experiment = create(stack, config(code, trialGracePeriod="4s", retry={"backoff": "0s"}))
    trial_id = submit(stack, experiment, {})
    running = wait_until(
        lambda: (t := trial(stack, trial_id))["status"] == "RUNNING" and t["intermediateCount"] and t,
        30,
        "the trial to run and report",
    )
    env = {**os.environ, "TRIALBUS_NATS_URL": stack.nats.url, "COLUMNS": "160"}
    # When its replica is drained (as before maintenance on its host)
    drained = subprocess.run(
        [TRIALBUS, "platform", "drain", "local-gpu", running["replica"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert drained.returncode == 0, drained.stderr
    assert f"local-gpu replica {running['replica']} drained: 1 trial(s) preempted" in drained.stdout
    # Then the trial got SIGTERM, saved its step within its grace period, and ran again on the other replica
    done = ended(stack, trial_id)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    [preempted] = done["attempts"]
    assert (preempted["status"], preempted["failure"]) == ("PREEMPTED", "preempted"), preempted
    assert preempted["replica"] == running["replica"] and done["replica"] != running["replica"]
    assert done["finalMetric"]["default"] > 0  # resumed from what the first attempt saved while stopping
    assert [a for a, _ in attempts_of(run_log, trial_id)] == [0, 1]
    # and the drained replica says so, takes nothing, until undrained
    listed = subprocess.run([TRIALBUS, "platform", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert f"{running['replica']} (draining)" in listed.stdout
    undrained = subprocess.run(
        [TRIALBUS, "platform", "undrain", "local-gpu", running["replica"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert undrained.returncode == 0 and "takes trials again" in undrained.stdout
    refused = stack.rest("POST", "/platforms/local-gpu/nosuch/drain")
    assert refused.status_code == 404 and "no replica 'nosuch'" in refused.json()["error"]


def test_a_spot_notice_drains_its_replica_and_the_preempted_trial_resumes_on_another(stack, tmp_path, run_log):
    # Given a local adapter replica on a spot VM (it watches the cloud's notice), running a trial
    cloud = CloudMetadata().start()
    try:
        stack.kill("adapter", signal.SIGTERM)
        stack.service_env["adapter@spot"] = {
            "TRIALBUS_SPOT_NOTICE": "aws",
            "TRIALBUS_SPOT_NOTICE_URL": cloud.url,
            "TRIALBUS_SPOT_NOTICE_INTERVAL": "0.2",
        }
        stack.start("adapter@spot")
        (tmp_path / "preemptible").mkdir()
        code = write_code(tmp_path / "preemptible", PREEMPTIBLE)
        experiment = create(stack, config(code, trialGracePeriod="4s", retry={"backoff": "0s"}))
        trial_id = submit(stack, experiment, {})
        wait_until(
            lambda: (t := trial(stack, trial_id))["status"] == "RUNNING" and t["intermediateCount"],
            30,
            "the trial to run and report on the spot replica",
        )
        stack.start("adapter")  # an on-demand replica beside it
        # When the cloud announces it reclaims the spot VM
        cloud.notice("aws")
        # Then that replica drained itself: the trial saved in its grace period and ran again on the other
        done = ended(stack, trial_id)
    finally:
        cloud.stop()
    assert (done["status"], done["attempt"], done["replica"]) == ("SUCCEEDED", 1, "test-host"), done
    [preempted] = done["attempts"]
    assert (preempted["status"], preempted["failure"], preempted["replica"]) == ("PREEMPTED", "preempted", "spot")
    assert "spot instance the cloud reclaims (instance-action terminate at" in preempted["message"]
    assert done["finalMetric"]["default"] > 0  # resumed from what the first attempt saved while stopping
    assert "spot notice from aws: instance-action terminate" in stack.log("adapter@spot")


#: Waits to be stopped; on SIGTERM it takes 0.5 s to save, then exits.
SAVES_ON_TERM = textwrap.dedent(
    """
    import os, signal, sys, time
    import nni, trialbus_trial

    params = nni.get_next_parameter()

    def on_term(signum, frame):
        time.sleep(0.5)
        (trialbus_trial.checkpoint_dir() / "saved").write_text("in the grace period")
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    open(params["flag"], "w").close()
    time.sleep(300)
    """
)


def test_a_trial_run_through_a_shell_gets_its_grace_period_when_stopped(stack, tmp_path):
    # Given a trial whose command is a shell list: the shell dies at SIGTERM at once, the trial under it does not
    (tmp_path / "shell").mkdir()
    code = write_code(tmp_path / "shell", SAVES_ON_TERM)
    experiment = create(stack, config(code, trialCommand=f"cd . && {sys.executable} trial.py", trialGracePeriod="5s"))
    flag = tmp_path / "started"
    trial_id = submit(stack, experiment, {"flag": str(flag)})
    wait_until(flag.exists, 30, "the trial to start")
    # When it is canceled
    assert stack.rest("POST", f"/trials/{trial_id}/cancel").status_code == 202
    # Then the trial had its grace period to save before its group was killed
    assert ended(stack, trial_id)["status"] == "USER_CANCELED"
    saved = stack.root / "data" / "checkpoints" / experiment / trial_id / "saved"
    assert saved.read_text() == "in the grace period"
