"""The Kubernetes emulator with Kueue installed, driven only through the official ``kubernetes``
client: the API group's discovery, LocalQueues and ClusterQueues, and pods with Kueue's labels
gated until their ClusterQueue has quota for them (``tests/emulators/kubernetes/kueue.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.emulators.kubernetes import Kubernetes, start_kubernetes
from tests.emulators.kubernetes.examples import cluster_queue, framework, local_queue
from tests.emulators.kubernetes.examples import task_role as role

FC = ("frameworkcontroller.microsoft.com", "v1")
KUEUE = ("kueue.x-k8s.io", "v1beta1")
GATE = "kueue.x-k8s.io/admission"


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubernetes]:
    emulator = start_kubernetes(tmp_path_factory.mktemp("kubernetes"), token="t0ken", kueue=True)
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def api(k8s: Kubernetes) -> Iterator[client.ApiClient]:
    with client.ApiClient(k8s.configuration()) as api_client:
        yield api_client


@pytest.fixture
def namespace() -> str:
    return f"ns{uuid.uuid4().hex[:8]}"


def queued(name: str, queue: str, count: int = 1, gpus: int = 1, **labels: str) -> dict[str, Any]:
    """A Framework of ``count`` tasks asking one GPU each, its pods labelled for ``queue``."""
    task_role = role("worker", "sleep 3", count=count)
    pod = task_role["task"]["pod"]
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    pod["metadata"] = {"labels": {"kueue.x-k8s.io/queue-name": queue, **labels}}
    if count > 1:
        pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] = name
        pod["metadata"]["annotations"] = {"kueue.x-k8s.io/pod-group-total-count": str(count)}
    return framework(name, task_role)


def pods(api: client.ApiClient, namespace: str, framework_name: str) -> list[client.V1Pod]:
    found = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"FC_FRAMEWORK_NAME={framework_name}")
    return found.items


def gated(pod: client.V1Pod) -> bool:
    return any(g.name == GATE for g in pod.spec.scheduling_gates or [])


def state(api: client.ApiClient, namespace: str, name: str) -> str:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(*FC, namespace, "frameworks", name)
    return (obj.get("status") or {}).get("state", "")


def test_discovery_announces_kueue_and_its_queues_are_served(api: client.ApiClient, namespace: str) -> None:
    groups = {g.name: g.preferred_version.version for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["kueue.x-k8s.io"] == "v1beta1"
    resources = client.CustomObjectsApi(api).get_api_resources(*KUEUE).resources
    assert {(r.name, r.namespaced) for r in resources} == {("localqueues", True), ("clusterqueues", False)}
    custom = client.CustomObjectsApi(api)
    cq = f"cq-{namespace}"
    custom.create_cluster_custom_object(*KUEUE, "clusterqueues", cluster_queue(cq, cpu=4, memory="8Gi", gpu=2))
    custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", local_queue("team-a", cq))
    assert custom.get_namespaced_custom_object(*KUEUE, namespace, "localqueues", "team-a")["spec"] == {
        "clusterQueue": cq
    }
    assert cq in [o["metadata"]["name"] for o in custom.list_cluster_custom_object(*KUEUE, "clusterqueues")["items"]]
    with pytest.raises(ApiException) as missing:
        custom.get_namespaced_custom_object(*KUEUE, namespace, "localqueues", "team-b")
    assert missing.value.status == 404
    with pytest.raises(ApiException) as invalid:
        custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", local_queue("x", cq) | {"spec": {}})
    assert invalid.value.status == 422


def test_a_group_waits_gated_until_its_cluster_queue_has_room(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    cq = f"cq-{namespace}"
    custom.create_cluster_custom_object(*KUEUE, "clusterqueues", cluster_queue(cq, cpu=8, memory="8Gi", gpu=2))
    custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", local_queue("team-a", cq))
    custom.create_namespaced_custom_object(*FC, namespace, "frameworks", queued("first", "team-a", count=2))
    wait_for(lambda: state(api, namespace, "first") == "AttemptRunning", what="the first group admitted and running")
    custom.create_namespaced_custom_object(*FC, namespace, "frameworks", queued("second", "team-a"))
    wait_for(lambda: len(pods(api, namespace, "second")) == 1, what="the second Framework's pod")
    [waiting] = pods(api, namespace, "second")
    assert gated(waiting) and waiting.status.phase == "Pending", waiting
    assert waiting.metadata.labels["kueue.x-k8s.io/managed"] == "true"
    assert [(c.type, c.status, c.reason) for c in waiting.status.conditions] == [
        ("PodScheduled", "False", "SchedulingGated")
    ]
    assert state(api, namespace, "second") == "AttemptPreparing"
    status = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", cq)["status"]
    assert status == {"admittedWorkloads": 1, "pendingWorkloads": 1}
    wait_for(lambda: state(api, namespace, "first") == "Completed", what="the first group's end")
    wait_for(lambda: state(api, namespace, "second") == "Completed", what="the second, admitted once quota freed")


def test_a_pod_of_a_missing_local_queue_stays_gated(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(*FC, namespace, "frameworks", queued("lost", "nobody"))
    wait_for(lambda: pods(api, namespace, "lost"), what="its pod")
    time.sleep(0.5)
    [pod] = pods(api, namespace, "lost")
    assert gated(pod) and state(api, namespace, "lost") == "AttemptPreparing"
    custom.patch_namespaced_custom_object(*FC, namespace, "frameworks", "lost", {"spec": {"executionType": "Stop"}})
    wait_for(lambda: state(api, namespace, "lost") == "Completed", what="a gated Framework stopped")
    assert pods(api, namespace, "lost") == []


def test_pods_without_the_queue_label_are_not_gated(api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(*FC, namespace, "frameworks", framework("plain", role("w", "sleep 0.2")))
    wait_for(lambda: state(api, namespace, "plain") == "Completed", what="a Framework without Kueue runs")
