"""Trials that outlive what runs them (issue 22) on OpenPAI (a job per trial, and reuse mode)
and on FrameworkController, against the emulators, as a user sees it: a trial whose node is
taken away mid-run runs again as its next attempt and resumes from its checkpoint on the
shared storage; a trial that fails on its own is retried only when the experiment asks; a pod
deleted by someone else (a drain, a preemption) is retried as ``preempted`` and finds the
checkpoint it wrote in its grace period (the emulator's SIGTERM reaches the pod's whole
process group, the keeper in it).

The emulators take a node away as the platforms report it: Kubernetes fails the pod with
reason NodeLost (FrameworkController: −1001 PodNodeLost, Transient); OpenPAI ends the task
with exit code −1001 (PodNodeLost, TRANSIENT) and retries the job by itself, as its exit spec
says for every transient failure, which Trialbus stops to retry the trial as its next attempt.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from contextlib import suppress
from pathlib import Path

import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.e2e.test_frameworkcontroller import NFS, fc_config, fc_stack, frameworks
from tests.emulators.kubernetes import start_kubernetes
from tests.fixtures.openpai import openpai_config, pai_job
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(120)

#: Counts ``steps``, saving the next step in its checkpoint directory after each one (or, with
#: ``save_on_term``, only when SIGTERM stops it: in the grace period of a deleted pod); a retry
#: starts from there. Each run appends "<attempt> <first step>" to ``log``. On attempt 0 it
#: hangs once past step ``hang_at`` (touching ``flag``), or exits ``exit`` at the end.
TRIAL = textwrap.dedent(
    """
    import signal, sys, time
    import nni, trialbus_trial

    params = nni.get_next_parameter()
    saved = trialbus_trial.checkpoint_dir() / "next-step"
    start = int(saved.read_text()) if saved.exists() else 0
    first = trialbus_trial.attempt() == 0
    with open(params["log"], "a") as log:
        log.write(f"{trialbus_trial.attempt()} {start}\\n")
    print(f"attempt {trialbus_trial.attempt()} starts at step {start}", flush=True)
    step = start

    def save(value):  # atomically: an attempt may be killed mid-write
        tmp = saved.with_name("next-step.tmp")
        tmp.write_text(str(value))
        tmp.replace(saved)

    def stopped(signum, frame):
        save(step)
        sys.exit(143)

    if params.get("save_on_term"):
        signal.signal(signal.SIGTERM, stopped)
    for step in range(start, params["steps"]):
        if first and step > params.get("hang_at", params["steps"]):
            open(params["flag"], "w").close()
            time.sleep(300)
        nni.report_intermediate_result(step)
        if not params.get("save_on_term"):
            save(step + 1)
    if first and "exit" in params:
        sys.exit(params["exit"])
    nni.report_final_result({"default": start, "attempt": trialbus_trial.attempt()})
    """
)


def runs(log: Path) -> list[tuple[int, int]]:
    """(attempt, first step) of each run of the trial, in order."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(a), int(s)) for a, s in (line.split() for line in lines)]


def failed_logs(request, *texts: str) -> None:
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(*texts, file=sys.stderr)


# -- FrameworkController ---------------------------------------------------------------------


@pytest.fixture
def fc_share(tmp_path: Path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    return folder


@pytest.fixture
def k8s(tmp_path: Path, fc_share: Path):
    emulator = start_kubernetes(tmp_path / "k8s", token="t0ken", volumes={NFS: str(fc_share)})
    yield emulator
    emulator.stop()


@pytest.fixture
def fc(tmp_path: Path, nats_server, k8s, fc_share: Path, request):
    stack = fc_stack(tmp_path, nats_server, k8s, fc_share, TRIALBUS_RELIST_INTERVAL="300")
    stack.start("dispatcher", "gateway", "frameworkcontroller")
    yield stack
    stack.stop()
    failed_logs(request, stack.logs(), k8s.log()[-4000:])


def pod_of(k8s, trial_id: str, attempt: int) -> str:
    """The pod of the trial's attempt (one task role ``worker`` of one task)."""
    found = [
        f["metadata"]["name"]
        for f in frameworks(k8s)
        if f["metadata"]["labels"]["trialbus.io/trial"] == trial_id
        and f["metadata"]["labels"]["trialbus.io/attempt"] == str(attempt)
    ]
    assert len(found) == 1, found
    return f"{found[0]}-worker-0"


def hung(stack: Stack, trial_id: str, flag: Path, results: int) -> None:
    """Wait until the trial's first attempt hangs with ``results`` intermediate results delivered."""
    wait_until(flag.exists, 30, "the first attempt to hang")
    wait_until(lambda: trial(stack, trial_id)["intermediateCount"] == results, 30, f"its {results} results")


def assert_logs_per_attempt(stack, trial_id: str) -> None:
    """Each attempt's log, from the share: the current one by default, the first by number."""
    current, first = (stack.rest("GET", f"/trials/{trial_id}/log{query}") for query in ("", "?attempt=0"))
    assert current.status_code == first.status_code == 200, (current.text, first.text)
    assert "attempt 1 starts at step 2" in current.text and "attempt 0 starts" not in current.text, current.text
    assert "attempt 0 starts at step 0" in first.text and "attempt 1 starts" not in first.text, first.text


def stop_keeper(share: Path, experiment: str, trial_id: str) -> dict:
    """SIGSTOP attempt 0's keeper (alive, but silent from now on), wherever on the share its
    task folder is; its state.json (whose trial group the test kills at the end)."""
    [state] = (share / "trialbus" / "trials" / experiment / f"{trial_id}-0").glob("*/.trialbus/state.json")
    found = json.loads(state.read_text())
    os.kill(found["keeperPid"], signal.SIGSTOP)
    return found


def leave_nothing(state: dict) -> None:
    """What a stopped keeper's attempt may leave running if the test failed before its end."""
    for kill, pid in ((os.killpg, state.get("pgid")), (os.kill, state.get("keeperPid"))):
        if pid:
            with suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def assert_silent_attempt_lost_and_retried(stack, trial_id: str, log: Path) -> None:
    done = ended(stack, trial_id, timeout=90)
    assert done["status"] == "SUCCEEDED", done
    assert done["attempt"] == 1 and done["finalMetric"] == {"default": 3, "attempt": 1}, done
    [lost] = done["attempts"]
    assert (lost["attempt"], lost["failure"]) == (0, "lost") and "no sign of life" in lost["message"], lost
    assert runs(log)[0] == (0, 0) and runs(log)[-1] == (1, 3), runs(log)


def test_fc_a_trial_whose_node_is_lost_is_retried_and_resumes_from_its_checkpoint(fc, k8s, tmp_path):
    # Given a trial that has done 3 of 6 steps (its checkpoint on the NFS share says so) and hangs
    experiment = create(fc, {**fc_config(write_code(tmp_path, TRIAL)), "retry": {"backoff": "0s"}})
    log, flag = tmp_path / "runs.log", tmp_path / "hung"
    trial_id = submit(fc, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag), "log": str(log)})
    hung(fc, trial_id, flag, 3)
    # When its node goes away (Kubernetes fails the pod NodeLost: FrameworkController's −1001)
    k8s.lose_node(pod_of(k8s, trial_id, 0))
    # Then it runs again as attempt 1, in a Framework of its own, from step 3, and succeeds
    done = ended(fc, trial_id)
    assert done["status"] == "SUCCEEDED", done
    assert done["attempt"] == 1 and done["finalMetric"] == {"default": 3, "attempt": 1}, done
    assert runs(log) == [(0, 0), (1, 3)]
    [first] = done["attempts"]
    assert (first["attempt"], first["status"], first["failure"]) == (0, "FAILED", "infrastructure"), first
    assert "completion code -1001 (PodNodeLost, transient)" in first["message"], first["message"]


def test_fc_a_trial_failing_on_its_own_is_retried_only_when_the_experiment_asks(fc, tmp_path):
    # Given two experiments whose trial exits 3 on its first attempt: one says nothing of retries
    code = write_code(tmp_path, TRIAL)
    plain = create(fc, fc_config(code))
    asked = create(fc, {**fc_config(code), "retry": {"trial": 1, "backoff": "0s"}})
    failing_log, retried_log = tmp_path / "failing.log", tmp_path / "retried.log"
    failing = submit(fc, plain, {"steps": 2, "exit": 3, "log": str(failing_log)})
    retried = submit(fc, asked, {"steps": 2, "exit": 3, "log": str(retried_log)})
    # Then the first ends FAILED, as NNI would, after one attempt
    failed = ended(fc, failing)
    assert (failed["status"], failed["attempt"], failed["exitCode"], failed["failure"]) == ("FAILED", 0, 3, "trial")
    assert failed["attempts"] == [] and runs(failing_log) == [(0, 0)]
    # And the second runs again (from its checkpoint) and succeeds
    done = ended(fc, retried)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    assert [(a["status"], a["exitCode"], a["failure"]) for a in done["attempts"]] == [("FAILED", 3, "trial")]
    assert runs(retried_log) == [(0, 0), (1, 2)]
    assert_logs_per_attempt(fc, retried)


def test_fc_a_deleted_pod_is_retried_as_preempted_and_finds_the_checkpoint_of_its_grace_period(fc, k8s, tmp_path):
    # Given a trial that saves its progress only when it is told to stop (SIGTERM), hung at step 3;
    # its command execs Python (through sh without exec, sh would end at once on SIGTERM, and the
    # keeper kill what is left of the trial's process group with it, before the checkpoint is saved)
    config = fc_config(write_code(tmp_path, TRIAL))
    config["trainingService"]["taskRoles"][0]["command"] = "exec python3 trial.py"
    experiment = create(fc, {**config, "retry": {"backoff": "0s"}})
    log, flag = tmp_path / "runs.log", tmp_path / "hung"
    trial_id = submit(
        fc, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag), "log": str(log), "save_on_term": True}
    )
    hung(fc, trial_id, flag, 3)
    # When someone deletes its pod (a drain, the scheduler making room for a pod of higher priority)
    k8s.delete_pod(pod_of(k8s, trial_id, 0))
    # Then the attempt ends preempted, and the next one starts where the grace period left it
    done = ended(fc, trial_id)
    assert (done["status"], done["attempt"], done["finalMetric"]) == ("SUCCEEDED", 1, {"default": 3, "attempt": 1})
    [first] = done["attempts"]
    assert (first["status"], first["failure"]) == ("PREEMPTED", "preempted"), first
    assert "completion code -101 (PodExternalDeleted, transient)" in first["message"], first["message"]
    assert runs(log) == [(0, 0), (1, 3)]


# -- OpenPAI (one job per trial; share, pai and pai_stack: tests/fixtures/openpai.py) --------


def test_fc_a_silent_trial_is_lost_stopped_and_run_again(fc, fc_share, tmp_path):
    # Given a trial whose experiment declares it lost after 3 s without a sign of its keeper, hung at step 3
    config = {**fc_config(write_code(tmp_path, TRIAL)), "retry": {"backoff": "0s", "heartbeatTimeout": "3s"}}
    experiment = create(fc, config)
    log, flag = tmp_path / "runs.log", tmp_path / "hung"
    trial_id = submit(fc, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag), "log": str(log)})
    hung(fc, trial_id, flag, 3)
    # When its keeper in the pod hangs (alive, silent) while the trial runs on
    state = stop_keeper(fc_share, experiment, trial_id)
    try:
        # Then the attempt is declared lost, its Framework stopped, and the trial runs again from step 3
        assert_silent_attempt_lost_and_retried(fc, trial_id, log)
    finally:
        leave_nothing(state)


def hung_pai_trial(pai_stack, pai, share, tmp_path: Path) -> tuple[str, str, Path]:
    """A trial (retried without back-off) that has done 3 of 6 steps, saved in its checkpoint on the
    share, and hangs there: its experiment, its id and its runs' log."""
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share)
    experiment = create(pai_stack, {**config, "retry": {"backoff": "0s"}})
    log, flag = tmp_path / "runs.log", tmp_path / "hung"
    trial_id = submit(pai_stack, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag), "log": str(log)})
    hung(pai_stack, trial_id, flag, 3)
    return experiment, trial_id, log


def test_pai_a_trial_whose_node_is_lost_is_retried_as_its_next_attempt_and_resumes(pai_stack, pai, share, tmp_path):
    # Given a trial that has done 3 of 6 steps (its checkpoint on the share says so) and hangs there
    experiment, trial_id, log = hung_pai_trial(pai_stack, pai, share, tmp_path)
    # When its node goes away (OpenPAI: exit code -1001 PodNodeLost, which it retries by itself)
    pai.fail_task(f"alice~trialbus_{experiment}_{trial_id}", -1001)
    # Then OpenPAI's own retry is stopped, and the trial runs again as attempt 1, from step 3
    done = ended(pai_stack, trial_id)
    assert done["status"] == "SUCCEEDED", done
    assert done["attempt"] == 1 and done["finalMetric"] == {"default": 3, "attempt": 1}, done
    [first] = done["attempts"]
    assert (first["attempt"], first["status"], first["failure"]) == (0, "FAILED", "infrastructure"), first
    assert "OpenPAI retried it by itself; Trialbus stopped that retry" in first["message"], first["message"]
    job = pai_job(pai, experiment, trial_id)["jobStatus"]
    assert (job["state"], job["retries"]) == ("STOPPED", 1), job
    # (OpenPAI's retry, still attempt 0 to the trial, may have begun before it was stopped: it hung at once)
    found = runs(log)
    assert found[0] == (0, 0) and found[-1] == (1, 3) and set(found[1:-1]) <= {(0, 3)}, found


def test_pai_a_silent_trial_is_lost_stopped_and_run_again(pai_stack, pai, share, tmp_path):
    # Given a trial whose experiment declares it lost after 3 s without a sign of its keeper, hung at step 3
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share)
    experiment = create(pai_stack, {**config, "retry": {"backoff": "0s", "heartbeatTimeout": "3s"}})
    log, flag = tmp_path / "runs.log", tmp_path / "hung"
    trial_id = submit(pai_stack, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag), "log": str(log)})
    hung(pai_stack, trial_id, flag, 3)
    # When its keeper in the job's container hangs (alive, silent) while the trial runs on
    state = stop_keeper(share[0], experiment, trial_id)  # (the adapter's side of the share)
    try:
        # Then the attempt is declared lost, its job stopped, and the trial runs again from step 3
        assert_silent_attempt_lost_and_retried(pai_stack, trial_id, log)
    finally:
        leave_nothing(state)


def test_pai_an_evicted_trial_is_retried_as_preempted_and_finds_the_checkpoint_of_its_grace_period(
    pai_stack, pai, share, tmp_path
):
    # Given a trial that saves its progress only when it is told to stop (SIGTERM), hung at step 3
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share)
    experiment = create(pai_stack, {**config, "retry": {"backoff": "0s"}})
    log, flag = tmp_path / "runs.log", tmp_path / "hung"
    trial_id = submit(
        pai_stack, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag), "log": str(log), "save_on_term": True}
    )
    hung(pai_stack, trial_id, flag, 3)
    # When Kubernetes evicts its pod (OpenPAI: exit code -1000 PodEvicted: SIGTERM, SIGKILL 2 s later,
    # which OpenPAI retries by itself)
    pai.fail_task(f"alice~trialbus_{experiment}_{trial_id}", -1000)
    # Then the attempt ends as preempted (read from the retried attempt's exit spec), and the trial runs
    # again from the step it saved in its grace period
    done = ended(pai_stack, trial_id)
    assert (done["status"], done["attempt"], done["finalMetric"]) == ("SUCCEEDED", 1, {"default": 3, "attempt": 1})
    [first] = done["attempts"]
    assert (first["status"], first["failure"]) == ("PREEMPTED", "preempted"), first
    assert "exit code -1000" in first["message"], first["message"]
    assert runs(log)[0] == (0, 0) and runs(log)[-1] == (1, 3), runs(log)


def test_pai_a_trial_failing_on_its_own_is_retried_only_when_the_experiment_asks(pai_stack, pai, share, tmp_path):
    # Given two experiments whose trial exits 3 on its first attempt: one says nothing of retries
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share)
    plain = create(pai_stack, config)
    asked = create(pai_stack, {**config, "retry": {"trial": 1, "backoff": "0s"}})
    failing_log, retried_log = tmp_path / "failing.log", tmp_path / "retried.log"
    failing = submit(pai_stack, plain, {"steps": 2, "exit": 3, "log": str(failing_log)})
    retried = submit(pai_stack, asked, {"steps": 2, "exit": 3, "log": str(retried_log)})
    # Then the first ends FAILED, as NNI would, after one attempt (OpenPAI's exit spec: unknown)
    failed = ended(pai_stack, failing)
    assert (failed["status"], failed["attempt"], failed["exitCode"], failed["failure"]) == ("FAILED", 0, 3, "trial")
    assert "(PAIRuntimeUnknownFailed, unknown)" in failed["message"], failed["message"]
    assert failed["attempts"] == [] and runs(failing_log) == [(0, 0)]
    # And the second runs again, as a job of its own, from its checkpoint, and succeeds
    done = ended(pai_stack, retried)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1), done
    assert [(a["status"], a["exitCode"], a["failure"]) for a in done["attempts"]] == [("FAILED", 3, "trial")]
    assert runs(retried_log) == [(0, 0), (1, 2)]
    assert_logs_per_attempt(pai_stack, retried)
    assert pai.job("alice", f"trialbus_{asked}_{retried}_1")["jobStatus"]["state"] == "SUCCEEDED"


def test_pai_reuse_a_trial_whose_environment_loses_its_node_is_retried_and_resumes(pai_stack, pai, share, tmp_path):
    # Given, in reuse mode, a trial that has done 3 of 6 steps in an environment job and hangs there
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, reuseMode=True)
    experiment = create(pai_stack, {**config, "retry": {"backoff": "0s"}})
    log, flag = tmp_path / "runs.log", tmp_path / "hung"
    trial_id = submit(pai_stack, experiment, {"steps": 6, "hang_at": 2, "flag": str(flag), "log": str(log)})
    hung(pai_stack, trial_id, flag, 3)
    [environment] = (share[0] / "trialbus" / "envs" / experiment).iterdir()
    # When the environment's node goes away (OpenPAI restarts the environment job by itself)
    pai.fail_task(f"alice~trialbus_{experiment}_env_{environment.name}", -1001)
    # Then the trial it ran fails for the infrastructure, and runs again as attempt 1, from step 3
    done = ended(pai_stack, trial_id)
    assert (done["status"], done["attempt"], done["finalMetric"]) == ("SUCCEEDED", 1, {"default": 3, "attempt": 1})
    [first] = done["attempts"]
    assert (first["status"], first["failure"]) == ("FAILED", "infrastructure"), first
    assert "interrupted: its OpenPAI environment restarted" in first["message"], first["message"]
    assert runs(log) == [(0, 0), (1, 3)]
