"""Multi-role OpenPAI and FrameworkController configs as NNI users write them: without
``reportingTaskRole`` (a Trialbus key NNI does not have) they run, and the first task role's
first task alone reports the trial's metrics and exit code, so the tuner sees each metric
once. ``reportingTaskRole`` chooses another role; one that names no role is refused at
creation with the roles listed.

Each platform's emulator runs every task as a real process through the adapter's own client
(``tests/emulators/openpai``, ``tests/emulators/kubernetes``). The roles are written
``worker`` then ``ps``, not in alphabetical order, so that a reordering on the way would show.
Every task runs the same trial and reports its own name in its metrics; the expected reporter
reports last, so that any other task that reached the gateway would be the one the tuner saw.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit
from tests.e2e.test_frameworkcontroller import NFS, fc_config, fc_stack
from tests.emulators.kubernetes import start_kubernetes
from tests.fixtures.openpai import openpai_config
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(240)

TRIAL = textwrap.dedent(
    """
    import os, time
    import nni

    role = os.environ.get("PAI_CURRENT_TASK_ROLE_NAME") or os.environ["FC_TASKROLE_NAME"]
    index = os.environ.get("PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX") or os.environ["FC_TASK_INDEX"]
    task = f"{role}-{index}"
    params = nni.get_next_parameter()
    if task == params["late"]:
        time.sleep(1.5)
    for step in range(2):
        nni.report_intermediate_result({"default": step, "task": task})
    nni.report_final_result({"default": params["x"], "task": task})
    """
)
TASKS = ["ps-0", "ps-1", "worker-0", "worker-1"]


def reported_once_by(stack: Stack, trial_id: str, reporter: str) -> None:
    """The trial succeeded; the tuner got its two intermediate results and its final one once
    each, all from ``reporter``; every task ran the trial (its own stdout holds its metrics)."""
    found = ended(stack, trial_id, timeout=90)
    assert found["status"] == "SUCCEEDED" and found["exitCode"] == 0, found
    assert found["finalMetric"] == {"default": 7, "task": reporter}, found
    records = stack.rest("GET", f"/trials/{trial_id}/metrics").json()
    assert [(r["type"], r["sequence"], r["value"]) for r in records] == [
        ("PERIODICAL", 0, {"default": 0, "task": reporter}),
        ("PERIODICAL", 1, {"default": 1, "task": reporter}),
        ("FINAL", 0, {"default": 7, "task": reporter}),
    ], records
    log = stack.rest("GET", f"/trials/{trial_id}/log").text
    stdout = {
        head.removesuffix("/stdout"): body
        for head, _, body in (part.partition(" <==\n") for part in log.split("==> ")[1:])
        if head.endswith("/stdout")
    }
    assert sorted(stdout) == TASKS, log
    for task, text in stdout.items():
        assert "NNISDK_MEb" in text and task in text, (task, text)


# -- OpenPAI ------------------------------------------------------------------------------------


def pai_job() -> dict:
    """``worker`` then ``ps``, two instances each; the job ends once every task has."""
    each = {
        "instances": 2,
        "dockerImage": "img",
        "resourcePerInstance": {"gpu": 0, "cpu": 1, "memoryMB": 512},
        "completion": {"minSucceededInstances": -1},
        "commands": ["python3 trial.py"],
    }
    return {
        "protocolVersion": 2,
        "name": "distributed",
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "python:3.11"}],
        "taskRoles": {"worker": dict(each), "ps": dict(each)},
    }


def test_openpai_without_a_reporting_role_the_first_role_s_first_instance_reports(
    pai_stack,
    pai,
    share,  # noqa: F811
    tmp_path,
):
    config = openpai_config(write_code(tmp_path, TRIAL), pai, share, openpaiConfig=pai_job())

    experiment = create(pai_stack, config)
    trial_id = submit(pai_stack, experiment, {"x": 7, "late": "worker-0"})

    reported_once_by(pai_stack, trial_id, "worker-0")


def test_openpai_reporting_task_role_chooses_another_role_and_a_wrong_one_is_refused(
    pai_stack,
    pai,
    share,  # noqa: F811
    tmp_path,
):
    code = write_code(tmp_path, TRIAL)
    wrong = pai_stack.rest(
        "POST",
        "/experiments",
        json=openpai_config(code, pai, share, openpaiConfig=pai_job(), reportingTaskRole="chief"),
    )
    assert wrong.status_code == 422, wrong.text
    assert "reportingTaskRole 'chief' is not a task role of openpaiConfig (worker, ps)" in wrong.json()["error"]
    assert pai_stack.rest("GET", "/experiments").json() == [], "nothing was created"

    experiment = create(pai_stack, openpai_config(code, pai, share, openpaiConfig=pai_job(), reportingTaskRole="ps"))
    trial_id = submit(pai_stack, experiment, {"x": 7, "late": "ps-0"})

    reported_once_by(pai_stack, trial_id, "ps-0")


# -- FrameworkController ------------------------------------------------------------------------


@pytest.fixture
def fc(tmp_path: Path, nats_server, request):
    """A Kubernetes emulator with FrameworkController, and the stack with its adapter."""
    folder = tmp_path / "nfs"
    folder.mkdir()
    k8s = start_kubernetes(tmp_path / "k8s", token="t0ken", volumes={NFS: str(folder)})
    stack = fc_stack(tmp_path, nats_server, k8s, folder)
    try:
        stack.start("dispatcher", "gateway", "frameworkcontroller")
        yield stack
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(stack.logs(), k8s.log()[-4000:], file=sys.stderr)
    finally:
        stack.stop()
        k8s.stop()


def fc_roles() -> list[dict]:
    """``worker`` then ``ps``, two tasks each (NNI's default completion: every task ends it)."""
    return [
        {
            "name": name,
            "taskNumber": 2,
            "command": "python3 trial.py",
            "cpuNumber": 1,
            "memorySize": "512mb",
            "dockerImage": "python:3.11",
        }
        for name in ("worker", "ps")
    ]


def test_frameworkcontroller_without_a_reporting_role_the_first_role_s_first_task_reports(fc, tmp_path):
    experiment = create(fc, fc_config(write_code(tmp_path, TRIAL), taskRoles=fc_roles()))
    trial_id = submit(fc, experiment, {"x": 7, "late": "worker-0"})

    reported_once_by(fc, trial_id, "worker-0")


def test_frameworkcontroller_reporting_task_role_chooses_another_role_and_a_wrong_one_is_refused(fc, tmp_path):
    code = write_code(tmp_path, TRIAL)
    wrong = fc.rest("POST", "/experiments", json=fc_config(code, taskRoles=fc_roles(), reportingTaskRole="chief"))
    assert wrong.status_code == 422, wrong.text
    assert "reportingTaskRole 'chief' is not a task role of taskRoles (worker, ps)" in wrong.json()["error"]
    assert fc.rest("GET", "/experiments").json() == [], "nothing was created"

    experiment = create(fc, fc_config(code, taskRoles=fc_roles(), reportingTaskRole="ps"))
    trial_id = submit(fc, experiment, {"x": 7, "late": "ps-0"})

    reported_once_by(fc, trial_id, "ps-0")
