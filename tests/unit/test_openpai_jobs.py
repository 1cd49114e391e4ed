"""The OpenPAI job of a trial (services/adapters/openpai/jobs.py), the openpai config, and how
an ended job reads as the trial's outcome (services/adapters/openpai/outcome.py)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from contracts import TrialStatus
from contracts.experiment import ExperimentConfig, OpenpaiConfig, format_validation_error, load_experiment_config
from services.adapters import sharefs
from services.adapters.base import TrialHandle
from services.adapters.openpai import adapter, jobs
from services.adapters.openpai import client as client_module
from services.adapters.openpai.client import OpenpaiClient
from services.trial_keeper import KEEPER_PATH
from tests.emulators.openpai import exitspec


def service(**extra) -> OpenpaiConfig:
    base = {
        "host": "pai.example.com",
        "username": "alice",
        "token": "tok",
        "trialCpuNumber": 2,
        "trialMemorySize": "8gb",
        "storageConfigName": "confignfs",
        "localStorageMountPoint": "/mnt/local",
        "containerStorageMountPoint": "/mnt/share",
        "virtualCluster": "gpu",
    }
    return OpenpaiConfig.model_validate({**base, **extra})


SHARE = sharefs.Share("/mnt/local/trialbus/trials/e/t-0", "/mnt/share/trialbus/trials/e/t-0")


def test_the_default_job_is_nni_s_with_our_name_and_wrapped_commands():
    job = jobs.render(service(), "trialbus_e_t", "python3 trial.py", 1, SHARE, "/k/trial_keeper.py")
    assert job["name"] == "trialbus_e_t" and job["protocolVersion"] == 2 and job["type"] == "job"
    role = job["taskRoles"]["taskrole"]
    assert role["resourcePerInstance"] == {"gpu": 1, "cpu": 2, "memoryMB": 8192}
    assert job["prerequisites"] == [{"name": "docker_image_0", "type": "dockerimage", "uri": "msranni/nni:latest"}]
    assert job["extras"]["storages"] == [{"name": "confignfs"}] and job["defaults"] == {"virtualCluster": "gpu"}
    assert "python3 trial.py" in role["commands"] and "tok" not in str(job), "the token never goes in the job"
    assert service().host == "https://pai.example.com", "https:// is put in front, as NNI does"


def test_the_user_s_job_keeps_every_field_and_its_templates():
    template = {
        "protocolVersion": 2,
        "name": "ignored",
        "type": "job",
        "jobRetryCount": 2,
        "parameters": {"lr": 0.1},
        "secrets": {"key": "s3cret"},
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "pytorch/pytorch"}],
        "taskRoles": {
            "worker": {
                "instances": 2,
                "dockerImage": "img",
                "resourcePerInstance": {"gpu": 1, "cpu": 4, "memoryMB": 8192, "ports": {"nccl": 1}},
                "commands": ["python3 train.py --lr <% $parameters.lr %> --key <% $secrets.key %>"],
            },
            "ps": {
                "instances": 1,
                "dockerImage": "img",
                "resourcePerInstance": {"gpu": 0, "cpu": 2, "memoryMB": 4096},
                "commands": ["python3 ps.py"],
            },
        },
        "extras": {
            "gangAllocation": True,
            "com.microsoft.pai.runtimeplugin": [{"plugin": "ssh", "parameters": {"jobssh": True}}],
        },
    }
    config = service(openpaiConfig=template)
    job = jobs.render(config, "trialbus_e_t", "ignored", 0, SHARE, "/k/trial_keeper.py")
    assert job["name"] == "trialbus_e_t" and job["jobRetryCount"] == 2 and job["secrets"] == {"key": "s3cret"}
    assert job["extras"] == template["extras"] and job["taskRoles"]["worker"]["instances"] == 2
    worker, ps = job["taskRoles"]["worker"]["commands"], job["taskRoles"]["ps"]["commands"]
    assert "python3 train.py --lr <% $parameters.lr %> --key <% $secrets.key %>" in worker
    assert "report.env" in worker[-1] and "report.env" not in ps[-1], "only the reporting role reports"
    assert template["taskRoles"]["worker"]["commands"] == [
        "python3 train.py --lr <% $parameters.lr %> --key <% $secrets.key %>"
    ], "the config is not changed"


def reporters(config: OpenpaiConfig) -> list[str]:
    """The task roles whose rendered commands may read ``report.env`` (their first instance reports)."""
    job = jobs.render(config, "trialbus_e_t", "python3 trial.py", 0, SHARE, "/k/trial_keeper.py")
    return [role for role, spec in job["taskRoles"].items() if "report.env" in spec["commands"][-1]]


def test_the_first_task_role_reports_unless_reporting_task_role_names_another():
    two = {"taskRoles": {"worker": {"commands": ["x"]}, "ps": {"commands": ["y"]}}}  # not in alphabetical order
    assert jobs.reporting_role(service(openpaiConfig=two)) == "worker", "NNI's configs have no reportingTaskRole"
    assert reporters(service(openpaiConfig=two)) == ["worker"]
    assert reporters(service(openpaiConfig=two, reportingTaskRole="ps")) == ["ps"]
    again = ExperimentConfig.model_validate_json(
        ExperimentConfig.model_validate(
            {
                "trialCommand": "x",
                "trialConcurrency": 1,
                "trialGpuNumber": 0,
                "trainingService": service(openpaiConfig=two).model_dump(
                    by_alias=True, context={"clear_secrets": True}
                ),
            }
        ).model_dump_json(by_alias=True, context={"clear_secrets": True})
    )
    assert jobs.reporting_role(again.training_service) == "worker", "the order survives the trip over the bus"
    assert reporters(service()) == ["taskrole"], "NNI's generated job: its one role"


def test_a_reporting_task_role_that_names_no_role_is_refused_with_the_roles(tmp_path: Path):
    two = {"taskRoles": {"worker": {"commands": ["x"]}, "ps": {"commands": ["y"]}}}
    with pytest.raises(ValidationError) as caught:
        service(openpaiConfig=two, reportingTaskRole="chief")
    expected = "reportingTaskRole 'chief' is not a task role of openpaiConfig (worker, ps)"
    assert expected in format_validation_error(caught.value)
    with pytest.raises(ValidationError, match=r"of the job generated without openpaiConfig \(taskrole\)"):
        service(reportingTaskRole="worker")
    # From openpaiConfigFile, the roles are known once the file is read (where the config is loaded).
    (tmp_path / "job.yml").write_text(yaml.safe_dump(two, sort_keys=False))
    (tmp_path / "config.yml").write_text(
        yaml.safe_dump(
            {
                "trialCommand": "x",
                "trialConcurrency": 1,
                "trialGpuNumber": 0,
                "trainingService": service(openpaiConfigFile="job.yml", reportingTaskRole="chief").model_dump(
                    by_alias=True, exclude_none=True, context={"clear_secrets": True}, mode="json"
                ),
            }
        )
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        jobs.reporting_role(load_experiment_config(tmp_path / "config.yml").training_service)
    with pytest.raises(ValidationError, match="set openpaiConfig or openpaiConfigFile, not both"):
        service(openpaiConfig=two, openpaiConfigFile="x.yml")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"trialMemorySize": "8 furlongs"}, "bad size '8 furlongs'"),
        ({"containerStorageMountPoint": "mnt/share"}, "must be an absolute path inside the container"),
        ({"token": None}, "token"),
        ({"trialCpuNumber": 0}, "trialCpuNumber"),
    ],
)
def test_bad_openpai_configs_are_refused(change, expected):
    data = {
        "trialCommand": "python3 t.py",
        "trialConcurrency": 1,
        "trialGpuNumber": 0,
        "trainingService": {
            "platform": "openpai",
            "host": "h",
            "username": "u",
            "token": "t",
            "trialCpuNumber": 1,
            "trialMemorySize": "1gb",
            "storageConfigName": "s",
            "localStorageMountPoint": "/l",
            "containerStorageMountPoint": "/c",
            **change,
        },
    }
    with pytest.raises(ValidationError) as caught:
        ExperimentConfig.model_validate(data)
    assert expected in format_validation_error(caught.value)
    del data["trialGpuNumber"]
    data["trainingService"] = {k: v for k, v in data["trainingService"].items() if k not in change}
    data["trainingService"].update(trialMemorySize="1gb", containerStorageMountPoint="/c", token="t", trialCpuNumber=1)
    with pytest.raises(ValidationError, match="trialGpuNumber must be set for platform openpai"):
        ExperimentConfig.model_validate(data)


def test_the_wrapped_commands_run_the_role_s_commands_under_the_keeper(tmp_path: Path):
    trial = tmp_path / "trial"
    (trial / ".trialbus").mkdir(parents=True)
    (trial / ".trialbus" / "report.env").write_bytes(sharefs.settings_file({"TRIALBUS_TRIAL_ID": "t1"}))
    (trial / ".trialbus" / "quiet.env").write_bytes(sharefs.settings_file({"TRIALBUS_TRIAL_ID": "t1"}))
    script = "\n".join(
        jobs.wrap(
            ["echo one $PAI_CURRENT_TASK_ROLE_NAME", "echo 'two \"quoted\" $HOME'"], True, str(trial), str(KEEPER_PATH)
        )
    )
    for index in ("0", "1"):
        env = {
            "PATH": "/usr/bin:/bin",
            "PAI_CURRENT_TASK_ROLE_NAME": "worker",
            "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": index,
        }
        subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30)
        out = (trial / f"worker-{index}" / "stdout").read_text()
        assert out == 'one worker\ntwo "quoted" $HOME\n', out


def test_a_wrapped_task_passes_sigterm_on_to_its_keeper_and_trial(tmp_path: Path):
    # In a container the task's shell is process 1, which ignores a signal it has no handler for: the
    # wrapped commands must hand a pod's SIGTERM to the keeper, which stops the trial with its grace period.
    trial = tmp_path / "trial"
    (trial / ".trialbus").mkdir(parents=True)
    (trial / ".trialbus" / "quiet.env").write_bytes(sharefs.settings_file({"TRIALBUS_TRIAL_ID": "t1"}))
    saved, ready = tmp_path / "saved", tmp_path / "ready"
    # not exec'd, and not the last line: the role's shell runs it as its child, as it runs most commands
    command = (
        "python3 -c 'import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), "
        f'open("{saved}", "w").write("checkpoint"), sys.exit(0))); open("{ready}", "w").close(); '
        "time.sleep(60)'"
    )
    script = "\n".join(jobs.wrap([command, "echo done"], False, str(trial), str(KEEPER_PATH)))
    env = {
        "PATH": "/usr/bin:/bin",
        "PAI_CURRENT_TASK_ROLE_NAME": "worker",
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": "0",
    }
    task = subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)
    state = trial / "worker-0" / ".trialbus" / "state.json"
    deadline = time.monotonic() + 20  # the keeper started the trial, and the trial has its SIGTERM handler
    while not ('"trialPid"' in (state.read_text() if state.exists() else "") and ready.exists()):
        assert time.monotonic() < deadline, "the trial never got ready"
        time.sleep(0.05)
    task.send_signal(signal.SIGTERM)  # to the shell only, as a container runtime does
    assert task.wait(20) == 143, task.returncode  # stopped by SIGTERM, once the trial had saved and exited
    assert saved.read_text() == "checkpoint"


def test_every_rendered_job_passes_the_server_s_schema():
    from tests.emulators.openpai.protocol import schema_errors

    two = {
        "protocolVersion": 2,
        "name": "x",
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "python:3.11"}],
        "taskRoles": {
            role: {
                "dockerImage": "img",
                "resourcePerInstance": {"gpu": 0, "cpu": 1, "memoryMB": 512},
                "commands": ["python3 trial.py"],
            }
            for role in ("worker", "ps")
        },
    }
    for config in (service(), service(openpaiConfig=two, reportingTaskRole="ps")):
        job = jobs.render(config, jobs.job_name("exp1", "Ab3dE", 2), "python3 trial.py", 1, SHARE, "/k/keeper.py")
        assert schema_errors(job) == [], job
    assert schema_errors({**job, "surprise": 1}), "the server's schema refuses unknown top-level keys"


def test_job_secrets_are_masked_outside_the_bus():
    template = {
        "secrets": {"key": "s3cret"},
        "taskRoles": {"w": {"commands": ["x"]}},
        "prerequisites": [
            {
                "name": "img",
                "type": "dockerimage",
                "uri": "r/i",
                "auth": {"username": "u", "password": "hunter2", "registryuri": "r"},
            }
        ],
    }
    config = ExperimentConfig.model_validate(
        {
            "trialCommand": "x",
            "trialConcurrency": 1,
            "trialGpuNumber": 0,
            "trainingService": {
                **service(openpaiConfig=template).model_dump(by_alias=True, mode="python"),
                "token": "tok",
            },
        }
    )
    shown = str(config.public_json())
    assert "s3cret" not in shown and "hunter2" not in shown and "tok'" not in shown
    wire = config.wire_json()["trainingService"]["openpaiConfig"]
    assert wire["secrets"] == {"key": "s3cret"} and wire["prerequisites"][0]["auth"]["password"] == "hunter2"


@pytest.mark.parametrize(
    ("code", "failure"),
    [
        (-1001, "infrastructure"),  # PodNodeLost
        (137, "infrastructure"),  # ContainerSigKillReceived: transient
        (251, "infrastructure"),  # JobGangAllocationTimeout: transient conflict
        (-101, "preempted"),  # PodExternalDeleted: a drain, a preemption
        (-1000, "preempted"),  # PodEvicted
        (-1003, "preempted"),  # PodPreemptedForCriticalPod
        (220, "permanent"),  # UserCommandExitWithError
        (-1200, "permanent"),  # UserContainerDockerOOMKilled
        (255, "trial"),  # PAIRuntimeUnknownFailed: a plain non-zero exit
        (256, "trial"),  # an undefined positive code
        (-8000, "trial"),  # an undefined negative code
    ],
)
def test_an_exit_spec_s_failure_class(code: int, failure: str):
    assert adapter.failure_of(exitspec.record(code)) == failure


def test_openpai_s_own_retries_after_platform_failures_are_counted_apart_from_jobretrycount_s():
    assert adapter.platform_retries({"retries": 3, "retryDetails": {"user": 2, "platform": 1, "resource": 0}}) == 1
    assert adapter.platform_retries({"retries": 2, "retryDetails": {"user": 2, "platform": 0, "resource": 0}}) == 0
    assert adapter.platform_retries({"retries": 2}) == 2, "without retryDetails, every retry"
    assert adapter.platform_retries({}) == 0


@pytest.fixture
def client():
    found = OpenpaiClient("https://pai.example.com", "alice", "tok", None, 5.0, 60.0)
    yield found
    asyncio.run(found.close())


def test_a_virtual_cluster_s_gpus_are_its_resources_total_s_gpu_or_gpus():
    body = {
        "default": {"resourcesTotal": {"cpu": 64, "memory": 1e6, "gpu": 8}},
        "old": {"resourcesTotal": {"GPUs": 2}},
        "both": {"resourcesTotal": {"gpu": "many", "GPUs": 3}},
        "unsaid": {"resourcesTotal": {"cpu": 4}},
        "odd": {"resourcesTotal": {"gpu": True}},
        "none": {"capacity": 10},
        "broken": "text",
    }
    assert client_module.vc_gpus(body) == {"default": 8.0, "old": 2.0, "both": 3.0}
    assert client_module.vc_gpus(["not", "a", "dict"]) == {}


def ended_job(client: OpenpaiClient, tmp_path: Path, state: str, status: dict, taken_back: str | None = None):
    """A job that ended in ``state``, with ``jobStatus`` ``status``; the keeper said nothing."""
    share = sharefs.Share(str(tmp_path), "/mnt/share/trialbus/trials/e/t-0")
    handle = TrialHandle("e", "t", 0, ref=f"alice~trialbus_e_t#{tmp_path}")
    job = adapter.Job(handle, client, "trialbus_e_t", share, "taskrole", state=state, taken_back=taken_back)
    job.detail = {"jobStatus": {"completedTime": 1795693229000, **status}}
    return job


def test_a_job_openpai_retried_by_itself_and_trialbus_stopped_ends_failed_infrastructure(client, tmp_path: Path):
    why = "OpenPAI retried it by itself; Trialbus stopped that retry"
    outcome = adapter.outcome_of(ended_job(client, tmp_path, "STOPPED", {"appExitCode": -210}, taken_back=why))
    assert (outcome.status, outcome.failure, outcome.exit_code, outcome.message) == (
        TrialStatus.FAILED,
        "infrastructure",
        None,
        why,
    )
    stopped = adapter.outcome_of(ended_job(client, tmp_path, "STOPPED", {"appExitCode": -210}))
    assert (stopped.status, stopped.failure) == (TrialStatus.SYS_CANCELED, None), "stopped by someone else"


def test_a_failed_job_s_outcome_says_its_exit_spec_and_failure_class(client, tmp_path: Path):
    status = {"appExitCode": -1003, "appExitSpec": exitspec.record(-1003), "appExitDiagnostics": "Pod failed: x"}
    outcome = adapter.outcome_of(ended_job(client, tmp_path, "FAILED", status))
    assert (outcome.status, outcome.failure) == (TrialStatus.FAILED, "preempted")
    assert "exit code -1003 (PodPreemptedForCriticalPod, transient): Pod failed: x" in outcome.message
    assert outcome.end_time is not None and outcome.end_time.year == 2026


def test_a_failed_job_carries_its_reporting_task_s_last_stderr_line(client, tmp_path: Path):
    job = ended_job(client, tmp_path, "FAILED", {"appExitCode": 1, "appExitSpec": exitspec.record(1)})
    state = tmp_path / f"{job.report}-0" / ".trialbus" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"exitCode": 1, "done": True, "lastError": "KeyError: 'lr'"}))
    outcome = adapter.outcome_of(job)
    assert (outcome.status, outcome.exit_code, outcome.last_error) == (TrialStatus.FAILED, 1, "KeyError: 'lr'")
