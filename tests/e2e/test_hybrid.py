"""NNI's hybrid mode end to end: one experiment over several platforms at once.

``trainingService`` is a list; the dispatcher sends each trial to one of the platforms by
their published capacity (:mod:`services.dispatcher.placement`), ``trialConcurrency`` holds
over all of them, and a platform that goes down stops getting trials without holding the
others back. The platforms are real: the local adapter, the remote adapter over a real sshd
on loopback (a remote trial sees ``SSH_CONNECTION``), the openpai adapter on the emulator.
"""

from __future__ import annotations

import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.e2e.test_remote import machine, remote_root, start_stack  # noqa: F401 - remote_root: a fixture
from tests.emulators.openpai import start_openpai
from tests.fixtures.openpai import openpai_config
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(240)

TRIAL = textwrap.dedent(
    """
    import os, time
    import nni

    params = nni.get_next_parameter()
    time.sleep(params.get("sleep", 0))
    where = "remote" if "SSH_CONNECTION" in os.environ else "pai" if "PAI_JOB_NAME" in os.environ else "local"
    nni.report_final_result({"default": params["x"], "where": where})
    """
)


def hybrid_config(code: Path, services: list[dict], concurrency: int = 4) -> dict:
    return {
        "experimentName": "hybrid-e2e",
        "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": concurrency,
        "trialGpuNumber": 0,
        "trainingService": services,
    }


def most_at_once(trials: list[dict], platform: str | None = None) -> int:
    """The most trials (of ``platform``) running at the same moment, from their start and end times."""
    moments = []
    for t in trials:
        if platform is None or t["platform"] == platform:
            moments += [(datetime.fromisoformat(t["startTime"]), 1), (datetime.fromisoformat(t["endTime"]), -1)]
    running = most = 0
    for _, step in sorted(moments, key=lambda m: (m[0], m[1])):  # an end before a start at the same instant
        running += step
        most = max(most, running)
    return most


@pytest.fixture
def local_remote(tmp_path: Path, nats_server, sshd, remote_root, stacks) -> Stack:  # noqa: F811
    """Dispatcher, gateway, the local adapter (two trials at most) and the remote adapter."""
    stack = start_stack(
        tmp_path, nats_server, [sshd], remote_root, TRIALBUS_STATUS_INTERVAL="1", TRIALBUS_UNREACHABLE_TIMEOUT="4"
    )
    stack.service_env["adapter"] = {"TRIALBUS_MAX_TRIALS": "2"}
    stack.start("adapter")
    stacks.append(stack)
    return stack


def test_trials_spread_over_local_and_remote_within_the_concurrency(local_remote, sshd, ssh_key, tmp_path):
    services = [{"platform": "local"}, {"platform": "remote", "machineList": [machine(sshd, ssh_key)]}]
    experiment = create(local_remote, hybrid_config(write_code(tmp_path, TRIAL), services))
    ids = [submit(local_remote, experiment, {"x": i, "sleep": 1.0}) for i in range(12)]
    finals = [ended(local_remote, t, timeout=120) for t in ids]
    assert [t["status"] for t in finals] == ["SUCCEEDED"] * 12, [t["message"] for t in finals]
    # Each trial says where it ran, and it ran where the dispatcher says it sent it.
    where = {"local-gpu": "local", "remote": "remote"}
    assert all(where[t["platform"]] == t["finalMetric"]["where"] for t in finals), finals
    on = [t["platform"] for t in finals]
    assert on.count("local-gpu") >= 3 and on.count("remote") >= 3, on
    assert most_at_once(finals) <= 4, "trialConcurrency holds over both platforms"
    assert most_at_once(finals, "local-gpu") <= 2, "the local adapter's maxTrials is room, never exceeded"
    shown = local_remote.rest("GET", f"/experiments/{experiment}").json()
    assert [s["platform"] for s in shown["config"]["trainingService"]] == ["local", "remote"]


def test_remote_machines_going_down_do_not_stall_the_experiment(local_remote, sshd, ssh_key, tmp_path):
    services = [{"platform": "remote", "machineList": [machine(sshd, ssh_key)]}, {"platform": "local"}]
    experiment = create(local_remote, hybrid_config(write_code(tmp_path, TRIAL), services, concurrency=3))
    first = [submit(local_remote, experiment, {"x": i, "sleep": 0.5}) for i in range(3)]
    assert {ended(local_remote, t)["platform"] for t in first} == {"local-gpu", "remote"}
    sshd.stop()  # the experiment's only SSH machine goes away
    wait_until(
        lambda: any(not m["up"] for r in local_remote.rest("GET", "/platforms").json() for m in r.get("machines", [])),
        30,
        "the remote adapter to see its machine down",
    )
    later = [submit(local_remote, experiment, {"x": i, "sleep": 0.2}) for i in range(3, 11)]
    finals = [ended(local_remote, t, timeout=60) for t in later]
    assert [(t["status"], t["platform"]) for t in finals] == [("SUCCEEDED", "local-gpu")] * 8, finals
    assert most_at_once(finals, "local-gpu") <= 2


def test_a_trial_waiting_for_a_platform_that_is_down_goes_elsewhere(tmp_path, nats_server, stacks, share):  # noqa: F811
    """Local and OpenPAI: trials land on both; with the openpai adapter stopped, the trials
    it had not started are taken back and run locally, as their next attempt."""
    pai = start_openpai(tmp_path / "pai", mounts={str(share[1]): str(share[0])})
    try:
        stack = Stack(
            root=tmp_path,
            nats=nats_server,
            extra_env={
                "TRIALBUS_STATUS_POLL": "0.3",
                "TRIALBUS_STATUS_INTERVAL": "1",
                "TRIALBUS_PLATFORM_STALE_AFTER": "3",
            },
            service_env={"adapter": {"TRIALBUS_MAX_TRIALS": "1"}},
        )
        stacks.append(stack.start("dispatcher", "gateway", "openpai", "adapter"))
        code = write_code(tmp_path, TRIAL)
        pai_service = openpai_config(code, pai, share)["trainingService"]
        experiment = create(stack, hybrid_config(code, [{"platform": "local"}, pai_service], concurrency=3))
        first = [submit(stack, experiment, {"x": i, "sleep": 0.5}) for i in range(6)]
        finals = [ended(stack, t, timeout=120) for t in first]
        assert [t["status"] for t in finals] == ["SUCCEEDED"] * 6, [t["message"] for t in finals]
        where = {"local-gpu": "local", "openpai": "pai"}
        assert all(where[t["platform"]] == t["finalMetric"]["where"] for t in finals), finals
        assert {t["platform"] for t in finals} == {"local-gpu", "openpai"}
        assert most_at_once(finals) <= 3 and most_at_once(finals, "local-gpu") <= 1

        stack.kill("openpai")  # gone: its status stops, and nobody takes its requests
        later = [submit(stack, experiment, {"x": i, "sleep": 0.2}) for i in range(6, 10)]
        finals = [ended(stack, t, timeout=60) for t in later]
        assert [(t["status"], t["platform"]) for t in finals] == [("SUCCEEDED", "local-gpu")] * 4, finals
        # Submitted while the adapter's last status was still fresh, some went to openpai first: taken back.
        moved = [t for t in finals if t["attempt"] > 0]
        assert moved, "a trial sent to the stopped adapter was taken back and run locally as its next attempt"
        assert all(trial(stack, t["id"])["platform"] == "local-gpu" for t in moved)
        assert "taken back from openpai, which went down before starting it" in stack.log("dispatcher")
    finally:
        pai.stop()


def test_a_preempted_trial_runs_again_on_the_other_platform_while_its_own_is_drained(
    local_remote, sshd, ssh_key, tmp_path
):
    # Given a hybrid experiment whose first trial runs on the local adapter
    services = [{"platform": "local"}, {"platform": "remote", "machineList": [machine(sshd, ssh_key)]}]
    config = {**hybrid_config(write_code(tmp_path, TRIAL), services, concurrency=1), "retry": {"backoff": "0s"}}
    experiment = create(local_remote, config)
    trial_id = submit(local_remote, experiment, {"x": 1, "sleep": 300})
    running = wait_until(lambda: (t := trial(local_remote, trial_id))["status"] == "RUNNING" and t, 30, "RUNNING")
    assert running["platform"] == "local-gpu"
    # When the local adapter's only replica is drained
    drained = local_remote.rest("POST", f"/platforms/local-gpu/{running['replica']}/drain")
    assert drained.status_code == 200 and drained.json()["preempted"] == 1, drained.text
    # Then the trial's next attempt goes to the platform that takes trials: remote
    moved = wait_until(
        lambda: (t := trial(local_remote, trial_id))["attempt"] == 1 and t["status"] == "RUNNING" and t,
        60,
        "attempt 1 to run",
    )
    assert moved["platform"] == "remote"
    assert [(a["platform"], a["failure"]) for a in moved["attempts"]] == [("local-gpu", "preempted")]
    assert local_remote.rest("POST", f"/trials/{trial_id}/cancel").status_code == 202
