"""Kueue in front of the frameworkcontroller adapter, end to end against the Kubernetes emulator
with Kueue installed (``tests/emulators/kubernetes/kueue.py``): the trials' pods go to a
LocalQueue, and a trial waits, saying so, while its ClusterQueue is full.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

import kubernetes
import pytest

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.e2e.test_frameworkcontroller import NFS, api_client, fc_config, fc_stack, within_the_role
from tests.e2e.test_openpai import TRIAL
from tests.emulators.kubernetes import start_kubernetes
from tests.emulators.kubernetes.examples import cluster_queue, local_queue

pytestmark = pytest.mark.timeout(240)

KUEUE = ("kueue.x-k8s.io", "v1beta1")
#: The LocalQueue of the stack's team (its built-in admin's team is ``admins``).
TEAM_QUEUE = "team-admins"
QUEUED = f"queued in Kueue LocalQueue {TEAM_QUEUE} (pods gated until admitted)"


@pytest.fixture
def share(tmp_path: Path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    return folder


@pytest.fixture
def k8s(tmp_path: Path, share: Path):
    emulator = start_kubernetes(tmp_path / "k8s", token="t0ken", volumes={NFS: str(share)}, kueue=True)
    yield emulator
    emulator.stop()


@pytest.fixture
def stack(tmp_path: Path, nats_server, k8s, share: Path, request):
    """The stack, whose adapter sends every team's trials to the LocalQueue ``team-<team>``."""
    found = fc_stack(tmp_path, nats_server, k8s, share, TRIALBUS_KUEUE_LOCAL_QUEUE="team-{team}")
    found.start("dispatcher", "gateway", "frameworkcontroller")
    yield found
    found.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(found.logs(), k8s.log()[-4000:], file=sys.stderr)


def one_gpu(code: Path, **service) -> dict:
    config = fc_config(code, **service)
    [role] = config["trainingService"]["taskRoles"]
    role["gpuNumber"] = 1
    return config


def make_queues(k8s, gpus: int) -> None:
    """The team's LocalQueue in namespace ``default``, over a ClusterQueue of ``gpus`` GPUs."""
    custom = kubernetes.client.CustomObjectsApi(api_client(k8s))
    body = cluster_queue("team-admins-cq", cpu=8, memory="8Gi", gpu=gpus)
    custom.create_cluster_custom_object(*KUEUE, "clusterqueues", body)
    custom.create_namespaced_custom_object(*KUEUE, "default", "localqueues", local_queue(TEAM_QUEUE, "team-admins-cq"))


def test_a_trial_waits_in_kueue_while_its_cluster_queue_is_full_and_runs_when_quota_frees(stack, k8s, tmp_path):
    make_queues(k8s, gpus=1)
    experiment = create(stack, one_gpu(write_code(tmp_path, TRIAL)))
    first = submit(stack, experiment, {"x": 1, "sleep": 4})
    wait_until(lambda: trial(stack, first)["status"] == "RUNNING", 30, "the first trial RUNNING")
    second = submit(stack, experiment, {"x": 2})
    wait_until(lambda: trial(stack, second)["message"] == QUEUED, 30, "the second trial queued in Kueue")
    assert trial(stack, second)["status"] == "WAITING"
    assert trial(stack, first)["status"] == "RUNNING", "the GPU is the first trial's until it ends"
    assert ended(stack, first)["status"] == "SUCCEEDED"
    found = ended(stack, second)
    assert found["status"] == "SUCCEEDED" and found["finalMetric"]["default"] == 2, found
    # (its start against the first's 4 s of work, less a poll's lag: the first's endTime is when the
    # adapter saw it end, which may come after Kueue saw its pods end and admitted the second)
    started, first_started = (datetime.fromisoformat(t) for t in (found["startTime"], trial(stack, first)["startTime"]))
    assert started >= first_started + timedelta(seconds=3), "admitted once the first trial's quota was freed"
    within_the_role(k8s.requests())


def test_a_two_role_trial_is_one_pod_group(stack, k8s, tmp_path):
    make_queues(k8s, gpus=2)
    roles = [
        {"name": "worker", "taskNumber": 1, "command": "python3 trial.py", "cpuNumber": 1, "memorySize": "512mb"},
        {"name": "ps", "taskNumber": 1, "command": "sleep 1", "cpuNumber": 1, "memorySize": "512mb"},
    ]
    experiment = create(stack, fc_config(write_code(tmp_path, TRIAL), taskRoles=roles, reportingTaskRole="worker"))
    trial_id = submit(stack, experiment, {"x": 1, "sleep": 2})
    wait_until(lambda: trial(stack, trial_id)["status"] == "RUNNING", 30, "RUNNING")
    core = kubernetes.client.CoreV1Api(api_client(k8s))
    pods = core.list_namespaced_pod("default").items
    assert len(pods) == 2
    for pod in pods:
        labels, annotations = pod.metadata.labels, pod.metadata.annotations
        assert labels["kueue.x-k8s.io/queue-name"] == TEAM_QUEUE
        assert labels["kueue.x-k8s.io/pod-group-name"] == labels["FC_FRAMEWORK_NAME"]
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "2"
        assert annotations["kueue.x-k8s.io/retriable-in-group"] == "false"
    assert ended(stack, trial_id)["status"] == "SUCCEEDED"


def test_a_local_queue_that_does_not_exist_fails_the_trial_and_is_refused_at_creation(stack, k8s, tmp_path):
    code = write_code(tmp_path, TRIAL)
    experiment = create(stack, fc_config(code))  # the team's LocalQueue is not known until a trial launches
    found = ended(stack, submit(stack, experiment, {"x": 1}))
    assert found["status"] == "FAILED", found
    assert found["message"].startswith(f"Kueue LocalQueue {TEAM_QUEUE} does not exist in namespace default"), found
    reply = stack.rest("POST", "/experiments", json=fc_config(code, kueue={"localQueue": "nope"}))
    assert reply.status_code == 422, reply.text
    assert "Kueue LocalQueue nope does not exist in namespace default" in reply.json()["error"]


def test_a_cluster_without_kueue_refuses_an_experiment_that_names_a_local_queue(tmp_path, nats_server, share):
    no_kueue = start_kubernetes(tmp_path / "k8s", token="t0ken", volumes={NFS: str(share)})
    stack = fc_stack(tmp_path, nats_server, no_kueue, share)
    try:
        stack.start("dispatcher", "gateway", "frameworkcontroller")
        config = fc_config(write_code(tmp_path, TRIAL), kueue={"localQueue": TEAM_QUEUE})
        reply = stack.rest("POST", "/experiments", json=config)
        assert reply.status_code == 422, reply.text
        assert "does not serve kueue.x-k8s.io: Kueue is not installed in this cluster" in reply.json()["error"]
    finally:
        stack.stop()
        no_kueue.stop()


def test_a_restarted_adapter_keeps_a_queued_trial_waiting_until_kueue_admits_it(stack, k8s, tmp_path):
    make_queues(k8s, gpus=1)
    experiment = create(stack, one_gpu(write_code(tmp_path, TRIAL)))
    first = submit(stack, experiment, {"x": 1, "sleep": 5})
    wait_until(lambda: trial(stack, first)["status"] == "RUNNING", 30, "the first trial RUNNING")
    second = submit(stack, experiment, {"x": 2})
    wait_until(lambda: trial(stack, second)["message"] == QUEUED, 30, "the second trial queued in Kueue")
    stack.kill("frameworkcontroller")
    stack.start("frameworkcontroller")
    assert trial(stack, second)["status"] == "WAITING"
    assert ended(stack, first)["status"] == "SUCCEEDED"
    assert ended(stack, second)["status"] == "SUCCEEDED"
