"""Reuse mode end to end: trials handed to a pool of long-running OpenPAI jobs (environments)
through the share, against the OpenPAI emulator over real HTTP."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.e2e.test_openpai import TRIAL, through_a_restart
from tests.fixtures.openpai import openpai_config
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def reuse_stack(tmp_path: Path, nats_server, pai, request):
    stack = Stack(
        root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_STATUS_POLL": "0.3", "TRIALBUS_REUSE_IDLE_TIMEOUT": "3"}
    )
    stack.start("dispatcher", "gateway", "openpai")
    yield stack
    stack.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(stack.logs(), pai.log()[-4000:], file=sys.stderr)


def jobs_of(pai) -> dict[str, str]:
    """Every job alice has on the cluster: name → state."""
    reply = httpx.get(f"{pai.api}/jobs", params={"username": "alice"}, headers=pai.headers("alice"))
    assert reply.status_code == 200, reply.text
    found = reply.json()
    return {job["name"]: job["state"] for job in (found["data"] if isinstance(found, dict) else found)}


def test_a_hundred_trials_run_on_four_environments_with_four_submissions(reuse_stack, pai, share, tmp_path):
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, reuseMode=True)
    experiment = create(reuse_stack, config)
    ids = [submit(reuse_stack, experiment, {"x": i, "intermediate": 1}) for i in range(100)]
    finals = [ended(reuse_stack, t, timeout=240) for t in ids]
    assert [t["status"] for t in finals] == ["SUCCEEDED"] * 100, [t["message"] for t in finals if t["message"]]
    assert [t["finalMetric"]["default"] for t in finals] == list(range(100))
    for trial_id in ids[:10]:
        records = reuse_stack.rest("GET", f"/trials/{trial_id}/metrics").json()
        assert [(r["type"], r["sequence"]) for r in records] == [("PERIODICAL", 0), ("FINAL", 0)]
    submitted = jobs_of(pai)
    assert len(submitted) == 4, submitted
    assert all(name.startswith(f"trialbus_{experiment}_env_") for name in submitted), submitted
    # Each environment forks these one-line Python trials from its own warm template
    states = [json.loads(p.read_text()) for p in share[0].glob("**/.trialbus/state.json")]
    assert sum(state.get("warm", False) for state in states) == 100, states[:3]
    # Idle environments are stopped (TRIALBUS_REUSE_IDLE_TIMEOUT=3 here).
    wait_until(lambda: set(jobs_of(pai).values()) == {"STOPPED"}, 30, "idle environments stopped")


def test_failure_and_cancel_in_an_environment_which_then_runs_the_next_trial(reuse_stack, pai, share, tmp_path):
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, reuseMode=True)
    config["trialConcurrency"] = 1
    experiment = create(reuse_stack, config)
    failing = submit(reuse_stack, experiment, {"x": 1, "exit": 3})
    found = ended(reuse_stack, failing)
    assert found["status"] == "FAILED" and found["exitCode"] == 3, found
    assert "exited with code 3" in found["message"], found["message"]
    sleeper = submit(reuse_stack, experiment, {"x": 2, "sleep": 60})
    wait_until(
        lambda: (share[0] / "trialbus" / "trials" / experiment / f"{sleeper}-0" / "taskrole-0").exists(),
        30,
        "the environment started the trial",
    )

    def cluster() -> dict:
        replicas = [p for p in reuse_stack.rest("GET", "/platforms").json() if p["adapter"] == "openpai"]
        return replicas[0]["clusters"][0] if replicas and replicas[0]["clusters"] else {}

    wait_until(lambda: cluster().get("busyEnvironments") == 1, 30, "/platforms shows the busy environment")
    assert cluster() == {
        "name": f"alice@{pai.url}",
        "jobs": 0,
        "environments": 1,
        "busyEnvironments": 1,
        "pausedFor": None,
        "error": None,
        "virtualClusters": {"default": 8},  # its GPUs, read from the cluster (the emulator's --vc-gpus)
    }
    assert reuse_stack.rest("POST", f"/trials/{sleeper}/cancel").status_code == 202
    assert ended(reuse_stack, sleeper)["status"] == "USER_CANCELED"
    after = submit(reuse_stack, experiment, {"x": 3})
    found = ended(reuse_stack, after)
    assert found["status"] == "SUCCEEDED" and found["finalMetric"]["default"] == 3, found
    assert len(jobs_of(pai)) == 1, "the three trials ran in one environment"


def test_a_restarted_adapter_adopts_environments_and_their_trials(reuse_stack, pai, share, tmp_path):
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, reuseMode=True)
    config["trialConcurrency"] = 2
    experiment = create(reuse_stack, config)
    through_a_restart(reuse_stack, experiment)
    more = [submit(reuse_stack, experiment, {"x": 10 + i}) for i in range(2)]
    assert [ended(reuse_stack, t)["status"] for t in more] == ["SUCCEEDED"] * 2
    assert len(jobs_of(pai)) == 2, "the adopted environments ran the next trials"


def test_an_environment_stopped_by_someone_else(reuse_stack, pai, share, tmp_path):
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, reuseMode=True)
    config["trialConcurrency"] = 1
    experiment = create(reuse_stack, config)
    sleeper = submit(reuse_stack, experiment, {"x": 1, "sleep": 60})
    wait_until(lambda: trial(reuse_stack, sleeper)["status"] == "RUNNING", 30, "RUNNING")
    wait_until(
        lambda: (share[0] / "trialbus" / "trials" / experiment / f"{sleeper}-0" / "taskrole-0").exists(),
        30,
        "the environment started the trial",
    )
    (env,) = jobs_of(pai)
    reply = httpx.put(f"{pai.api}/jobs/alice~{env}/executionType", json={"value": "STOP"}, headers=pai.headers("alice"))
    assert reply.status_code in (200, 202), reply.text
    found = ended(reuse_stack, sleeper)
    assert found["status"] == "SYS_CANCELED" and "stopped outside Trialbus" in found["message"], found
    after = submit(reuse_stack, experiment, {"x": 2})
    assert ended(reuse_stack, after)["status"] == "SUCCEEDED"
    assert len(jobs_of(pai)) == 2, "a new environment replaced the stopped one"


def test_a_two_role_environment_runs_each_trial_in_both_roles(reuse_stack, pai, share, tmp_path):
    small = {"gpu": 0, "cpu": 1, "memoryMB": 1024}
    job = {
        "protocolVersion": 2,
        "name": "x",
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "python:3.11"}],
        "taskRoles": {
            "worker": {
                "instances": 1,
                "dockerImage": "img",
                "resourcePerInstance": small,
                "commands": ["python3 trial.py"],
            },
            "ps": {
                "instances": 1,
                "dockerImage": "img",
                "resourcePerInstance": small,
                "commands": ["echo $NNI_TRIAL_JOB_ID >> ps-trials.txt", "sleep 30"],
            },
        },
    }
    # The worker reports once the ps task of its trial has written its line: the ps tasks are
    # stopped when the worker reports, which a fast worker could otherwise do before ps ran at all.
    worker = TRIAL.replace(
        "params = nni.get_next_parameter()\n",
        textwrap.dedent("""\
        params = nni.get_next_parameter()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not os.path.exists("ps-trials.txt")
                                               or nni.get_trial_id() not in open("ps-trials.txt").read().split()):
            time.sleep(0.05)
    """),
    )
    assert worker != TRIAL
    config = openpai_config(
        write_code(tmp_path, worker), pai, share, reuseMode=True, openpaiConfig=job, reportingTaskRole="worker"
    )
    config["trialConcurrency"] = 1
    experiment = create(reuse_stack, config)
    ids = [submit(reuse_stack, experiment, {"x": i}) for i in range(2)]
    finals = [ended(reuse_stack, t) for t in ids]
    assert [t["finalMetric"] for t in finals] == [{"default": i, "role": "worker"} for i in range(2)], finals
    code = next((share[0] / "trialbus" / "code").iterdir())
    # The ps tasks were stopped when the worker reported (their `sleep 30` never finished).
    wait_until(lambda: (code / "ps-trials.txt").read_text().split() == ids, 30, "ps ran both trials")
    assert len(jobs_of(pai)) == 1
