"""``platform: frameworkcontroller``: the config (NNI's rules, the v1 layout converted), the
Framework a trial becomes, and how a Framework's status reads as the trial's outcome."""

from __future__ import annotations

import copy
import re
import textwrap
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from contracts import TrialStatus
from contracts.experiment import ExperimentConfig, format_validation_error, load_experiment_config
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.adapters.frameworkcontroller import frameworks
from tests.emulators.kubernetes.schema import check_framework
from trialbus.cli import app

ROLE = {
    "name": "worker",
    "taskNumber": 2,
    "command": "python3 mnist.py",
    "gpuNumber": 1,
    "cpuNumber": 2,
    "memorySize": "8gb",
    "dockerImage": "pytorch/pytorch:2.1",
}
NFS = {"storageType": "nfs", "server": "10.0.0.5", "path": "/export/nni"}


def config(**service) -> dict:
    return {
        "trialConcurrency": 2,
        "trainingService": {"platform": "frameworkcontroller", "storage": NFS, "taskRoles": [ROLE], **service},
    }


def errors_of(data: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        ExperimentConfig.model_validate(data)
    return format_validation_error(caught.value)


def test_a_v2_config_needs_no_trial_command_and_takes_both_spellings_of_the_policy():
    role = {**ROLE, "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceededTaskCount": 2}}
    found = ExperimentConfig.model_validate(config(taskRoles=[role], namespace="ml", serviceAccountName="fc"))
    service = found.training_service
    assert isinstance(service, FrameworkcontrollerConfig) and found.adapter == "frameworkcontroller"
    assert found.trial_command == "python3 mnist.py", "the role's command, as NNI's converter does"
    assert service.task_roles[0].framework_attempt_completion_policy.min_succeed_task_count == 2
    assert service.task_roles[0].memory_mb == 8192 and service.storage.url == "nfs://10.0.0.5/export/nni"
    assert service.reuse_mode is True, "NNI's default; every trial is one Framework either way"
    again = ExperimentConfig.model_validate(
        config(
            taskRoles=[
                {**ROLE, "framework_attempt_completion_policy": {"min_failed_task_count": 1, "minSucceedTaskCount": 1}}
            ]
        )
    )
    assert again.training_service.task_roles[0].framework_attempt_completion_policy.min_succeed_task_count == 1


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        ({"taskRoles": [{**ROLE, "name": "Worker_1"}]}, "must match ^[a-z0-9]{1,63}$"),
        (
            {"taskRoles": [ROLE, {**ROLE, "name": "ps"}], "reportingTaskRole": "chief"},
            "reportingTaskRole 'chief' is not a task role of taskRoles (worker, ps)",
        ),
        ({"taskRoles": [ROLE, ROLE]}, "task role names must differ"),
        ({"taskRoles": []}, "taskRoles: List should have at least 1 item"),
        ({"storage": {"storageType": "pvc", "path": "/x"}}, "storageType must be nfs or azureStorage, not 'pvc'"),
        (
            {
                "storage": {
                    "storageType": "azureStorage",
                    "azureAccount": "acct",
                    "azureShare": "share",
                    "keyVaultName": "vault",
                }
            },
            "set both keyVaultName and keyVaultKey",
        ),
        ({"taskRoles": [{**ROLE, "memorySize": "8 furlongs"}]}, "bad size '8 furlongs'"),
        ({"namespace": "Not_A_Namespace"}, "namespace: String should match pattern"),
        ({"containerMountPath": "mnt"}, "must be an absolute path inside the pods"),
        ({"preparingTimeout": "soon"}, "bad duration 'soon'"),
        ({"kueue": {"localQueue": "Team_A"}}, "kueue.localQueue: String should match pattern"),
        ({"kueue": {"queue": "team-a"}}, "trainingService.kueue: Kueue does not have field(s) queue"),
    ],
)
def test_bad_configs_are_refused_with_the_reason(service: dict, expected: str):
    assert expected in errors_of(config(**service))


def test_the_v1_layout_is_converted_as_nnictl_converts_it(tmp_path: Path):
    (tmp_path / "config.yml").write_text(
        textwrap.dedent("""
        authorName: default
        experimentName: example_mnist_pytorch
        trialConcurrency: 1
        maxExecDuration: 1h
        maxTrialNum: 10
        trainingServicePlatform: frameworkcontroller
        searchSpacePath: search_space.json
        useAnnotation: false
        tuner:
          builtinTunerName: TPE
          classArgs: {optimize_mode: maximize}
        trial:
          codeDir: .
          taskRoles:
            - name: worker
              taskNum: 1
              command: python3 mnist.py
              gpuNum: 1
              cpuNum: 1
              memoryMB: 8192
              image: msranni/nni:latest
              frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceededTaskCount: 1}
        frameworkcontrollerConfig:
          storage: nfs
          serviceAccountName: frameworkcontroller
          nfs: {server: 10.10.10.10, path: /var/nfs/nni}
        """)
    )
    found = load_experiment_config(tmp_path / "config.yml")
    service = found.training_service
    assert (found.trial_command, found.max_trial_number) == ("python3 mnist.py", 10)
    assert found.max_experiment_duration == 3600
    assert found.tuner == {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}
    assert found.search_space_file == str(tmp_path / "search_space.json")
    assert isinstance(service, FrameworkcontrollerConfig) and service.service_account_name == "frameworkcontroller"
    assert service.storage.url == "nfs://10.10.10.10/var/nfs/nni"
    role = service.task_roles[0]
    assert (role.task_number, role.gpu_number, role.cpu_number, role.memory_mb) == (1, 1, 1, 8192)
    assert role.framework_attempt_completion_policy.min_succeed_task_count == 1


def test_v1_layouts_nni_does_not_convert_are_refused(tmp_path: Path):
    (tmp_path / "pvc.yml").write_text(
        yaml.safe_dump(
            {
                "trainingServicePlatform": "frameworkcontroller",
                "trialConcurrency": 1,
                "trial": {"codeDir": "."},
                "frameworkcontrollerConfig": {"storage": "pvc", "configPath": "fc_template.yml", "pvc": {"path": "/x"}},
            }
        )
    )
    with pytest.raises(ValueError, match="pvc storage or a configPath template is not converted"):
        load_experiment_config(tmp_path / "pvc.yml")


def service_of(**service) -> FrameworkcontrollerConfig:
    return ExperimentConfig.model_validate(config(**service)).training_service


def test_a_trial_s_framework():
    roles = [
        {**ROLE, "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": -1, "minSucceedTaskCount": 1}},
        {**ROLE, "name": "ps", "gpuNumber": 0, "taskNumber": 1},
    ]
    service = service_of(
        taskRoles=roles, serviceAccountName="runner", retryPolicy={"fancyRetryPolicy": True, "maxRetryCount": 2}
    )
    body = frameworks.render(
        service,
        "exp1",
        "AbC9d",
        1,
        "host-1",
        "/tmp/mount/trialbus/trials/exp1/AbC9d-1",
        "/tmp/mount/trialbus/bin/h/trial_keeper.py",
    )
    meta = body["metadata"]
    assert re.fullmatch(r"[a-z0-9]{1,63}", meta["name"]) and meta["name"].startswith("tbexp1tabc9da1")
    assert meta["name"] != frameworks.name_of("exp1", "abc9d", 1), "ids differing in case differ in name"
    assert meta["labels"] == {
        "trialbus.io/experiment": "exp1",
        "trialbus.io/trial": "AbC9d",
        "trialbus.io/attempt": "1",
        "trialbus.io/replica": "host-1",
    }
    assert body["spec"]["executionType"] == "Start"
    assert body["spec"]["retryPolicy"] == {"fancyRetryPolicy": True, "maxRetryCount": 2}
    worker, ps = body["spec"]["taskRoles"]
    assert worker["frameworkAttemptCompletionPolicy"] == {"minFailedTaskCount": 1, "minSucceededTaskCount": 1}
    assert ps["frameworkAttemptCompletionPolicy"] == {"minFailedTaskCount": 1, "minSucceededTaskCount": -1}
    assert worker["task"]["retryPolicy"] == {"fancyRetryPolicy": False, "maxRetryCount": 0}
    pod = worker["task"]["pod"]["spec"]
    container = pod["containers"][0]
    assert (
        container["resources"]["requests"]
        == container["resources"]["limits"]
        == {"cpu": "2", "memory": "8192Mi", "nvidia.com/gpu": "1"}
    )
    assert "nvidia.com/gpu" not in ps["task"]["pod"]["spec"]["containers"][0]["resources"]["limits"]
    assert pod["volumes"] == [{"name": "trialbus-storage", "nfs": {"server": "10.0.0.5", "path": "/export/nni"}}]
    assert container["volumeMounts"] == [{"name": "trialbus-storage", "mountPath": "/tmp/mount"}]
    assert pod["serviceAccountName"] == "runner" and pod["restartPolicy"] == "Never"
    script = container["command"][2]
    assert container["command"][:2] == ["sh", "-c"] and "python3 mnist.py" in script
    assert "$FC_TASKROLE_NAME" in script and "report.env" in script
    assert "report.env" not in ps["task"]["pod"]["spec"]["containers"][0]["command"][2]
    assert check_framework(copy.deepcopy(body), strict=True) == [], "the CRD's schema, no field pruned"
    for role in (worker, ps):  # the part the CRD does not check: a valid PodTemplate
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "x"},
            "template": role["task"]["pod"],
        }
        kubernetes_validate.validate(template, "1.30", strict=True)


def test_a_trial_queued_in_kueue_is_one_pod_group_of_all_its_tasks():
    roles = [ROLE, {**ROLE, "name": "ps", "gpuNumber": 0, "taskNumber": 1}]
    plain = frameworks.render(service_of(taskRoles=roles), "exp1", "t1", 0, "r", "/tmp/mount/t", "/k.py")
    assert [r["task"]["pod"]["metadata"] for r in plain["spec"]["taskRoles"]] == [
        {"labels": {"trialbus.io/experiment": "exp1"}}
    ] * 2, "without Kueue the pods are as they always were"

    body = frameworks.render(service_of(taskRoles=roles), "exp1", "t1", 0, "r", "/tmp/mount/t", "/k.py", "team-a")
    name = body["metadata"]["name"]
    for role in body["spec"]["taskRoles"]:
        assert role["task"]["pod"]["metadata"] == {
            "labels": {
                "trialbus.io/experiment": "exp1",
                "kueue.x-k8s.io/queue-name": "team-a",
                "kueue.x-k8s.io/pod-group-name": name,
            },
            "annotations": {
                "kueue.x-k8s.io/pod-group-total-count": "3",
                "kueue.x-k8s.io/retriable-in-group": "false",
            },
        }
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "x"},
            "template": role["task"]["pod"],
        }
        kubernetes_validate.validate(template, "1.30", strict=True)
    assert check_framework(copy.deepcopy(body), strict=True) == []
    assert frameworks.queue_of(body) == "team-a" and frameworks.queue_of(plain) is None

    single = {**ROLE, "taskNumber": 1}
    alone = frameworks.render(service_of(taskRoles=[single]), "e", "t", 0, "r", "/tmp/mount/t", "/k.py", "team-a")
    assert alone["spec"]["taskRoles"][0]["task"]["pod"]["metadata"] == {
        "labels": {"trialbus.io/experiment": "e", "kueue.x-k8s.io/queue-name": "team-a"}
    }, "one pod: a workload of its own, no group"
    retried = service_of(taskRoles=roles, retryPolicy={"maxRetryCount": 1})
    again = frameworks.render(retried, "e", "t", 0, "r", "/tmp/mount/t", "/k.py", "team-a")
    annotations = again["spec"]["taskRoles"][0]["task"]["pod"]["metadata"]["annotations"]
    assert "kueue.x-k8s.io/retriable-in-group" not in annotations, "FC's replacement pods rejoin the group"


def test_the_kueue_local_queue_is_the_experiment_s_else_the_adapter_s_for_its_team():
    from services.adapters.errors import PermanentError
    from services.adapters.frameworkcontroller.client import Kubernetes
    from services.adapters.frameworkcontroller.kueue import Kueue
    from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings

    def no_cluster() -> Kubernetes:
        raise AssertionError("choosing the LocalQueue asks the cluster nothing")

    def queue(template: str | None, team: str | None, **service) -> str | None:
        kueue = Kueue(FrameworkcontrollerSettings(kueue_local_queue=template), kube=no_cluster)
        return kueue.queue_for(service_of(**service), team, "exp1")

    assert queue(None, "vision") is None, "no Kueue unless asked"
    assert queue(None, None, kueue={"localQueue": "mine"}) == "mine"
    assert queue("team-{team}", "vision", kueue={"localQueue": "mine"}) == "mine", "the experiment's first"
    assert queue("team-{team}", "ml_ops") == "team-ml-ops"
    assert queue("shared", None) == "shared"
    with pytest.raises(PermanentError, match="experiment exp1 has no team"):
        queue("team-{team}", None)


def test_the_first_task_role_reports_unless_reporting_task_role_names_another():
    roles = [ROLE, {**ROLE, "name": "ps"}, {**ROLE, "name": "chief"}]

    def reporters(**chosen: str) -> list[str]:
        body = frameworks.render(service_of(taskRoles=roles, **chosen), "e", "t", 0, "r", "/tmp/mount/t", "/k.py")
        return [
            role["name"]
            for role in body["spec"]["taskRoles"]
            if "report.env" in role["task"]["pod"]["spec"]["containers"][0]["command"][2]
        ]

    assert reporters() == ["worker"], "NNI's configs have no reportingTaskRole: the first role reports"
    assert reporters(reportingTaskRole="chief") == ["chief"]
    assert service_of(taskRoles=roles[::-1]).reporting_role.name == "chief", "the order written, not sorted"


def test_azure_storage_mounts_the_experiment_s_secret():
    storage = {"storageType": "azureStorage", "azureAccount": "acct", "azureShare": "trials"}
    body = frameworks.render(service_of(storage=storage), "exp1", "t1", 0, "r", "/tmp/mount/t", "/tmp/mount/k.py")
    assert check_framework(copy.deepcopy(body), strict=True) == []
    volume = body["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["volumes"][0]
    assert volume == {
        "name": "trialbus-storage",
        "azureFile": {"secretName": "trialbus-exp1-azure", "shareName": "trials", "readOnly": False},
    }


def completed(code: int, kind: str, attributes: list[str] | None, trigger: str | None = None) -> dict:
    completion = {
        "code": code,
        "phrase": "Phrase",
        "type": {"name": kind, "attributes": attributes},
        "diagnostics": "diagnosed\nmore",
    }
    if trigger:
        completion["trigger"] = {"message": trigger, "taskRoleName": "worker", "taskIndex": 0}
    return {
        "metadata": {"name": "fw"},
        "status": {
            "state": "Completed",
            "completionTime": "2026-11-22T10:00:00Z",
            "attemptStatus": {"completionStatus": completion},
        },
    }


@pytest.mark.parametrize(
    ("framework", "keeper", "canceled", "status", "failure", "says"),
    [
        (completed(0, "Succeeded", []), {"exitCode": 0}, False, TrialStatus.SUCCEEDED, None, None),
        (completed(0, "Succeeded", None), {}, False, TrialStatus.SUCCEEDED, None, None),
        (
            completed(3, "Failed", None, "FailedTaskCount 1 has reached MinFailedTaskCount 1 in the TaskRole"),
            {"exitCode": 3},
            False,
            TrialStatus.FAILED,
            "trial",
            "completion code 3 (Phrase, unknown); the trial command exited with 3: FailedTaskCount 1 has reached",
        ),
        (
            completed(200, "Failed", ["Transient"]),
            {},
            False,
            TrialStatus.FAILED,
            "infrastructure",
            "completion code 200 (Phrase, transient): diagnosed",
        ),
        (completed(210, "Failed", ["Permanent"]), {}, False, TrialStatus.FAILED, "permanent", "(Phrase, permanent)"),
        (
            completed(201, "Failed", ["Transient", "Conflict"]),
            {},
            False,
            TrialStatus.FAILED,
            "infrastructure",
            "code 201",
        ),
        (completed(-1200, "Failed", ["Permanent"]), {}, False, TrialStatus.FAILED, "permanent", "code -1200"),
        (completed(-300, "Failed", []), {}, False, TrialStatus.FAILED, "trial", "code -300"),
        # a pod stopped for someone else's reason is preempted; a lost node is the infrastructure's
        (completed(-101, "Failed", ["Transient"]), {}, False, TrialStatus.FAILED, "preempted", "code -101"),
        (completed(-1000, "Failed", ["Transient"]), {}, False, TrialStatus.FAILED, "preempted", "code -1000"),
        (completed(-1003, "Failed", ["Transient"]), {}, False, TrialStatus.FAILED, "preempted", "code -1003"),
        (completed(-1001, "Failed", ["Transient"]), {}, False, TrialStatus.FAILED, "infrastructure", "code -1001"),
        (
            completed(-210, "Failed", ["Permanent"]),
            {},
            False,
            TrialStatus.SYS_CANCELED,
            None,
            "Framework fw was stopped outside Trialbus",
        ),
        (
            completed(-210, "Failed", ["Permanent"]),
            {"exitCode": -15},
            True,
            TrialStatus.FAILED,
            "permanent",
            "the trial command exited with -15",
        ),
    ],
)
def test_a_completed_framework_s_outcome(framework, keeper, canceled, status, failure, says):
    outcome = frameworks.outcome_of(framework, keeper, canceled)
    assert (outcome.status, outcome.failure) == (status, failure)
    assert outcome.end_time is not None and outcome.end_time.year == 2026
    if says:
        assert says in outcome.message, outcome.message
    else:
        assert outcome.message is None and outcome.exit_code == 0


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        ("AttemptCreationPending", "waiting"),
        ("AttemptCreationRequested", "waiting"),
        ("AttemptPreparing", "waiting"),
        ("AttemptRunning", "running"),
        ("AttemptDeletionPending", "running"),
        ("AttemptDeletionRequested", "running"),
        ("AttemptDeleting", "running"),
        ("AttemptCompleted", "running"),
        ("Completed", "ended"),
    ],
)
def test_every_framework_state_reads_as_the_trial_s(state: str, phase: str):
    assert frameworks.phase(frameworks.state_of({"status": {"state": state}})) == phase


def test_a_framework_without_status_is_pending():
    assert frameworks.state_of(None) == frameworks.state_of({"status": None}) == "AttemptCreationPending"


def test_trialbus_render_prints_the_framework(tmp_path: Path):
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config(containerMountPath="/mnt/nni")))
    result = CliRunner().invoke(app, ["render", "-f", str(tmp_path / "config.yml")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# The Framework of trial TRIAL of experiment EXPERIMENT")
    body = yaml.safe_load(result.output)
    assert body["kind"] == "Framework" and body["metadata"]["namespace"] == "default"
    command = body["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["containers"][0]["command"][2]
    assert "/mnt/nni/trialbus/trials/EXPERIMENT/TRIAL-0" in command
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config(kueue={"localQueue": "team-a"})))
    result = CliRunner().invoke(app, ["render", "-f", str(tmp_path / "config.yml")])
    labels = yaml.safe_load(result.output)["spec"]["taskRoles"][0]["task"]["pod"]["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a", "the pods as Kueue will see them"


def test_a_failed_framework_carries_its_keeper_s_last_stderr_line():
    keeper = {"exitCode": 1, "lastError": "ModuleNotFoundError: No module named 'sklearn'"}
    failed = frameworks.outcome_of(completed(1, "Failed", None), keeper, False)
    assert (failed.status, failed.last_error) == (TrialStatus.FAILED, keeper["lastError"])
    fine = frameworks.outcome_of(completed(0, "Succeeded", []), {**keeper, "exitCode": 0}, False)
    assert fine.last_error is None
