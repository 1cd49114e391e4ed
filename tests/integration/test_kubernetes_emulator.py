"""The Kubernetes emulator, driven only through the official ``kubernetes`` client: discovery, the
Framework and Secret verbs with their Status errors, the CRD's validation, watches that resume,
and the simulated FrameworkController running real processes on mapped volumes.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.emulators.kubernetes import Kubernetes, start_kubernetes
from tests.emulators.kubernetes.examples import framework
from tests.emulators.kubernetes.examples import task_role as role
from tests.emulators.processes import alive

GROUP, VERSION, PLURAL = "frameworkcontroller.microsoft.com", "v1", "frameworks"
TOKEN = "emulator-test-token"
STUCK_IMAGE = "registry.invalid/never-pulls:1"
CHAIN = [
    "AttemptCreationPending",
    "AttemptCreationRequested",
    "AttemptPreparing",
    "AttemptRunning",
    "AttemptDeletionPending",
    "AttemptDeletionRequested",
    "AttemptDeleting",
    "AttemptCompleted",
    "Completed",
]


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def status_of(exc: ApiException) -> dict[str, Any]:
    body = json.loads(exc.body)
    assert (body["kind"], body["apiVersion"], body["status"], body["code"]) == ("Status", "v1", "Failure", exc.status)
    return body


class Fc:
    """CustomObjectsApi on Frameworks in one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.ns = client.CustomObjectsApi(api), namespace

    def create(self, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.api.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body, **kw)

    def create_yaml(self, text: str) -> dict[str, Any]:
        """POST a YAML body, as ``kubectl create -f`` can (the typed method takes dicts only)."""
        api_client = self.api.api_client
        request = api_client.param_serialize(
            "POST",
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}",
            path_params={"group": GROUP, "version": VERSION, "namespace": self.ns, "plural": PLURAL},
            header_params={"Content-Type": "application/yaml", "Accept": "application/json"},
            body=text,
            auth_settings=["BearerToken"],
        )
        response = api_client.call_api(*request)
        response.read()
        return api_client.response_deserialize(response, {"201": "object"}).data

    def get(self, name: str) -> dict[str, Any]:
        return self.api.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def list(self, **kw: Any) -> list[str]:
        items = self.api.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, **kw)["items"]
        return sorted(i["metadata"]["name"] for i in items)

    def patch(self, name: str, body: Any, content_type: str | None = None) -> dict[str, Any]:
        kw = {"_content_type": content_type} if content_type else {}
        return self.api.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, body, **kw)

    def delete(self, name: str) -> dict[str, Any]:
        return self.api.delete_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, propagation_policy="Foreground"
        )

    def state(self, name: str) -> str | None:
        return (self.get(name).get("status") or {}).get("state")

    def task(self, name: str, role_index: int = 0, index: int = 0) -> dict[str, Any]:
        roles = self.get(name)["status"]["attemptStatus"]["taskRoleStatuses"]
        return roles[role_index]["taskStatuses"][index]

    def wait(self, name: str, state: str = "Completed", timeout: float = 15.0) -> dict[str, Any]:
        wait_for(lambda: self.state(name) == state, timeout, f"{name} to be {state}")
        return self.get(name)


@pytest.fixture(scope="module")
def share(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nfs-share")


@pytest.fixture(scope="module")
def azure_share(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("azure-share")


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory, share: Path, azure_share: Path) -> Iterator[Kubernetes]:
    emulator = start_kubernetes(
        tmp_path_factory.mktemp("kubernetes"),
        token=TOKEN,
        stuck_images=[STUCK_IMAGE],
        volumes={"nfs://nfs.example/exports": str(share), "azurefile://trials": str(azure_share)},
    )
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def api(k8s: Kubernetes) -> Iterator[client.ApiClient]:
    with client.ApiClient(k8s.configuration()) as api_client:
        yield api_client


@pytest.fixture
def fc(api: client.ApiClient) -> Fc:
    return Fc(api, unique("ns"))


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    """A mount path under /tmp that does not exist yet (the emulator makes it a link)."""
    return tmp_path / "mnt" / "data"


# ---------------------------------------------------------------- discovery, auth, kubeconfig


def test_discovery_announces_frameworks_and_secrets(api: client.ApiClient, tmp_path: Path) -> None:
    groups = {g.name: g.preferred_version.group_version for g in client.ApisApi(api).get_api_versions().groups}
    assert groups == {GROUP: f"{GROUP}/{VERSION}"}
    frameworks = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources
    assert [(r.name, r.kind, r.namespaced) for r in frameworks] == [("frameworks", "Framework", True)]
    assert {"create", "get", "list", "watch", "patch", "delete"} <= set(frameworks[0].verbs)
    assert "secrets" in [r.name for r in client.CoreV1Api(api).get_api_resources().resources]
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]

    # Given a cluster without FrameworkController, the group is absent and its paths answer 404.
    with start_kubernetes(tmp_path / "nocrd", serve_crd=False) as bare, client.ApiClient(bare.configuration()) as c:
        assert client.ApisApi(c).get_api_versions().groups == []
        with pytest.raises(ApiException) as missing:
            client.CustomObjectsApi(c).get_api_resources(GROUP, VERSION)
        assert missing.value.status == 404 and status_of(missing.value)["reason"] == "NotFound"
        with pytest.raises(ApiException) as create:
            Fc(c, "default").create(framework("x", role("w", "true")))
        assert create.value.status == 404


def test_token_required_and_kubeconfig_works(k8s: Kubernetes, tmp_path: Path) -> None:
    with client.ApiClient(client.Configuration(host=k8s.url)) as anonymous, pytest.raises(ApiException) as denied:
        Fc(anonymous, "default").list()
    assert denied.value.status == 401 and status_of(denied.value)["reason"] == "Unauthorized"

    path = k8s.kubeconfig(tmp_path / "kubeconfig", namespace="team")
    _, active = config.list_kube_config_contexts(config_file=str(path))
    assert active["context"]["namespace"] == "team"
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=configuration)
    with client.ApiClient(configuration) as from_file:
        assert client.ApisApi(from_file).get_api_versions().groups[0].name == GROUP
        assert Fc(from_file, "team").list() == []


# ---------------------------------------------------------------- verbs, Status errors, validation


def test_create_sets_metadata_and_errors_are_status_objects(fc: Fc) -> None:
    name = unique()
    created = fc.create(framework(name, role("worker", "true"), execution="Create", labels={"app": "x"}))
    meta = created["metadata"]
    assert (meta["name"], meta["namespace"], meta["generation"], meta["labels"]) == (name, fc.ns, 1, {"app": "x"})
    assert meta["uid"] and int(meta["resourceVersion"]) > 0 and meta["creationTimestamp"].endswith("Z")
    assert fc.get(name)["metadata"]["uid"] == meta["uid"]

    with pytest.raises(ApiException) as dup:
        fc.create(framework(name, role("worker", "true")))
    body = status_of(dup.value)
    assert (dup.value.status, body["reason"]) == (409, "AlreadyExists")
    assert body["message"] == f'frameworks.{GROUP} "{name}" already exists'
    assert body["details"] == {"name": name, "group": GROUP, "kind": "frameworks"}

    for call in (lambda: fc.get("missing"), lambda: fc.delete("missing"), lambda: fc.patch("missing", {})):
        with pytest.raises(ApiException) as missing:
            call()
        assert (missing.value.status, status_of(missing.value)["reason"]) == (404, "NotFound")

    # A YAML body is accepted too, and a replace needs the current resourceVersion.
    other = unique()
    yaml_body = yaml.safe_dump(framework(other, role("worker", "true"), execution="Create"))
    assert fc.create_yaml(yaml_body)["metadata"]["name"] == other
    stale = fc.get(other)
    fc.patch(other, {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiException) as conflict:
        fc.api.replace_namespaced_custom_object(GROUP, VERSION, fc.ns, PLURAL, other, stale)
    assert (conflict.value.status, status_of(conflict.value)["reason"]) == (409, "Conflict")


@pytest.mark.parametrize(
    ("mutate", "field", "text"),
    [
        (lambda f: f["metadata"].update(name="Trial-1"), "metadata.name", "should match '^[a-z0-9]{1,63}$'"),
        (lambda f: f["spec"].update(executionType="Run"), "spec.executionType", 'supported values: "Create"'),
        (
            lambda f: f["spec"].update(retryPolicy={"maxRetryCount": -3}),
            "spec.retryPolicy.maxRetryCount",
            "greater than or equal to -2",
        ),
        (
            lambda f: f["spec"]["taskRoles"][0].update(taskNumber=10001),
            "spec.taskRoles[0].taskNumber",
            "less than or equal to 10000",
        ),
        (lambda f: f["spec"]["taskRoles"][0].update(name="ps_0"), "spec.taskRoles[0].name", "should match"),
        (
            lambda f: f["spec"]["taskRoles"][0]["frameworkAttemptCompletionPolicy"].update(minFailedTaskCount=-2),
            "spec.taskRoles[0].frameworkAttemptCompletionPolicy.minFailedTaskCount",
            "greater than or equal to -1",
        ),
        (
            lambda f: f["spec"]["taskRoles"][0].update(taskNumber="2"),
            "spec.taskRoles[0].taskNumber",
            "must be of type integer",
        ),
    ],
)
def test_schema_violations_are_422_with_the_field(
    fc: Fc, mutate: Callable[[dict[str, Any]], None], field: str, text: str
) -> None:
    body = framework(unique(), role("worker", "true"), execution="Create")
    mutate(body)
    with pytest.raises(ApiException) as bad:
        fc.create(body)
    status = status_of(bad.value)
    assert (bad.value.status, status["reason"]) == (422, "Invalid")
    assert f"{field}: " in status["message"] and text in status["message"], status["message"]
    assert status["details"]["causes"][0]["field"] == field


def test_unknown_fields_pruned_or_rejected_when_strict(fc: Fc, tmp_path: Path) -> None:
    body = framework(unique(), role("worker", "true"), execution="Create")
    body["spec"]["colour"] = "blue"
    body["spec"]["taskRoles"][0]["frameworkAttemptCompletionPolicy"]["minFailedTaskcount"] = 1  # a typo
    created = fc.create(body)
    assert "colour" not in created["spec"]
    assert created["spec"]["taskRoles"][0]["frameworkAttemptCompletionPolicy"] == {
        "minFailedTaskCount": 1,
        "minSucceededTaskCount": -1,
    }
    assert created["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["containers"][0]["image"] == "busybox"

    with (
        start_kubernetes(tmp_path / "strict", strict=True, namespaces=["team"]) as strict,
        client.ApiClient(strict.configuration()) as c,
    ):
        with pytest.raises(ApiException) as rejected:
            Fc(c, "team").create(body)
        assert rejected.value.status == 400
        assert 'unknown field "spec.colour"' in status_of(rejected.value)["message"]
        with pytest.raises(ApiException) as elsewhere:
            Fc(c, "other").create(framework(unique(), role("worker", "true")))
        assert (elsewhere.value.status, status_of(elsewhere.value)["message"]) == (404, 'namespaces "other" not found')


def test_list_by_label_selector(fc: Fc, api: client.ApiClient) -> None:
    names = {tier: unique() for tier in ("a", "b", "none")}
    for tier, name in names.items():
        labels = {"app": "demo"} | ({"tier": tier} if tier != "none" else {})
        fc.create(framework(name, role("worker", "true"), execution="Create", labels=labels))
    assert fc.list(label_selector="app=demo") == sorted(names.values())
    assert fc.list(label_selector="app=demo,tier=a") == [names["a"]]
    assert fc.list(label_selector="tier!=a") == sorted([names["b"], names["none"]])
    assert fc.list(label_selector="tier") == sorted([names["a"], names["b"]])
    assert fc.list(label_selector="!tier") == [names["none"]]
    assert fc.list(label_selector="tier in (a,b),app") == sorted([names["a"], names["b"]])
    assert fc.list(field_selector=f"metadata.name={names['b']}") == [names["b"]]
    listed = client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL, label_selector="tier=b")
    assert [i["metadata"]["name"] for i in listed["items"]] == [names["b"]]
    assert int(listed["metadata"]["resourceVersion"]) >= 3


def test_patch_rules(fc: Fc) -> None:
    name = unique()
    fc.create(framework(name, role("worker", "true"), execution="Create"))
    with pytest.raises(ApiException) as strategic:
        fc.patch(name, {"spec": {"executionType": "Start"}}, "application/strategic-merge-patch+json")
    assert (strategic.value.status, status_of(strategic.value)["reason"]) == (415, "UnsupportedMediaType")

    failing = [
        {"op": "test", "path": "/spec/executionType", "value": "Start"},
        {"op": "replace", "path": "/spec/executionType", "value": "Stop"},
    ]
    with pytest.raises(ApiException) as test_op:
        fc.patch(name, failing, "application/json-patch+json")
    assert (test_op.value.status, status_of(test_op.value)["reason"]) == (422, "Invalid")
    fc.wait(name, "AttemptCreationPending")
    time.sleep(0.2)
    current = fc.get(name)  # Create stays pending, and nothing of the failed patch was applied
    assert (current["spec"]["executionType"], current["status"]["state"]) == ("Create", "AttemptCreationPending")

    start = [
        {"op": "test", "path": "/spec/executionType", "value": "Create"},
        {"op": "replace", "path": "/spec/executionType", "value": "Start"},
    ]
    assert fc.patch(name, start, "application/json-patch+json")["spec"]["executionType"] == "Start"
    done = fc.wait(name)
    assert done["status"]["attemptStatus"]["completionStatus"]["code"] == 0
    with pytest.raises(ApiException) as backwards:
        fc.patch(name, {"spec": {"executionType": "Create"}})
    assert backwards.value.status == 422 and "spec.executionType" in status_of(backwards.value)["message"]


# ---------------------------------------------------------------- the controller


def test_tasks_run_on_nfs_with_fc_environment(fc: Fc, api: client.ApiClient, share: Path, mount: Path) -> None:
    name = unique()
    volume = [{"name": "data", "nfs": {"server": "nfs.example", "path": f"/exports/{name}"}}]
    mounts = [{"name": "data", "mountPath": str(mount)}]
    write = (
        f"echo $FC_TASK_INDEX > {mount}/out-$FC_TASKROLE_NAME-$FC_TASK_INDEX && "
        f"env | grep ^FC_ | sort > {mount}/env-$FC_TASKROLE_NAME-$FC_TASK_INDEX && echo hello {{{{FC_POD_NAME}}}}"
    )
    ps = role("ps", f"{write} && pwd -P > cwd", volumes=volume, mounts=mounts)
    ps["task"]["pod"]["spec"]["containers"][0]["workingDir"] = str(mount)
    created = fc.create(framework(name, role("worker", write, count=2, volumes=volume, mounts=mounts), ps))
    status = fc.wait(name)["status"]
    completion = status["attemptStatus"]["completionStatus"]
    assert (completion["code"], completion["type"]["name"]) == (0, "Succeeded")
    assert completion["diagnostics"].startswith("CompletedTaskCount 3 has reached TotalTaskCount 3")

    folder = share / name
    assert {p.name: p.read_text() for p in folder.glob("out-*")} == {
        "out-worker-0": "0\n",
        "out-worker-1": "1\n",
        "out-ps-0": "0\n",
    }
    assert (folder / "cwd").read_text() == f"{folder.resolve()}\n"  # workingDir, through the mount
    env = dict(line.split("=", 1) for line in (folder / "env-worker-1").read_text().splitlines())
    assert env["FC_FRAMEWORK_NAME"] == name and env["FC_FRAMEWORK_NAMESPACE"] == fc.ns
    assert (env["FC_TASKROLE_NAME"], env["FC_TASK_INDEX"]) == ("worker", "1")
    assert env["FC_POD_NAME"] == f"{name}-worker-1" and env["FC_CONFIGMAP_NAME"] == f"{name}-attempt"
    assert env["FC_FRAMEWORK_UID"] == created["metadata"]["uid"]
    assert (env["FC_FRAMEWORK_ATTEMPT_ID"], env["FC_TASK_ATTEMPT_ID"]) == ("0", "0")
    task = fc.task(name, 0, 1)
    assert task["state"] == "Completed" and task["attemptStatus"]["podUID"] == env["FC_POD_UID"]
    assert task["attemptStatus"]["completionStatus"]["diagnostics"] == "Pod succeeded"
    log = client.CoreV1Api(api).read_namespaced_pod_log(f"{name}-ps-0", fc.ns)
    assert log == f"hello {name}-ps-0\n"


def test_failed_task_fails_the_framework_and_kills_the_rest(fc: Fc, tmp_path: Path) -> None:
    name = unique()
    command = f"if [ $FC_TASK_INDEX = 0 ]; then sleep 0.3; exit 3; fi; echo $$$$ > {tmp_path}/pid; exec sleep 30"
    fc.create(framework(name, role("worker", command, count=2, policy=(1, -1))))
    completion = fc.wait(name)["status"]["attemptStatus"]["completionStatus"]
    message = "FailedTaskCount 1 has reached MinFailedTaskCount 1 in the TaskRole"
    assert (completion["code"], completion["phrase"], completion["type"]) == (
        3,
        "ContainerUnrecognizedFailed",
        {"name": "Failed", "attributes": []},
    )
    assert completion["trigger"] == {"message": message, "taskRoleName": "worker", "taskIndex": 0}
    failed, killed = fc.task(name, 0, 0), fc.task(name, 0, 1)
    assert failed["attemptStatus"]["completionStatus"]["pod"]["containers"][0]["code"] == 3
    assert killed["attemptStatus"]["completionStatus"]["code"] == -220
    assert not alive(int((tmp_path / "pid").read_text()))


def test_without_completion_policy_all_failed_tasks_still_succeed(fc: Fc) -> None:
    name = unique()
    fc.create(framework(name, role("worker", "exit 1", count=2, policy=None)))
    completion = fc.wait(name)["status"]["attemptStatus"]["completionStatus"]
    assert (completion["code"], completion["type"]["name"]) == (0, "Succeeded")  # the pitfall of B.3
    assert [fc.task(name, 0, i)["attemptStatus"]["completionStatus"]["code"] for i in (0, 1)] == [1, 1]


def test_retry_policies(fc: Fc, tmp_path: Path) -> None:
    counted, permanent, transient = unique(), unique(), unique()
    runs = tmp_path / "runs"
    fc.create(framework(counted, role("worker", f"echo run >> {runs}; exit 1"), retry={"maxRetryCount": 1}))
    fc.create(framework(permanent, role("worker", "exit 210"), retry={"fancyRetryPolicy": True, "maxRetryCount": 3}))
    marker = tmp_path / "marker"
    flaky = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 200"
    fc.create(framework(transient, role("worker", flaky), retry={"fancyRetryPolicy": True, "maxRetryCount": 0}))

    status = fc.wait(counted)["status"]
    assert runs.read_text() == "run\nrun\n"
    assert status["attemptStatus"]["id"] == 1 and status["attemptStatus"]["completionStatus"]["code"] == 1
    assert status["retryPolicyStatus"] | {"retryDelaySec": None} == {
        "totalRetriedCount": 1,
        "accountableRetriedCount": 1,
        "retryDelaySec": None,
    }

    status = fc.wait(permanent)["status"]
    completion = status["attemptStatus"]["completionStatus"]
    assert (completion["code"], completion["phrase"], completion["type"]["attributes"]) == (
        210,
        "ContainerPermanentFailed",
        ["Permanent"],
    )
    assert status["retryPolicyStatus"]["totalRetriedCount"] == 0

    status = fc.wait(transient)["status"]
    assert status["attemptStatus"]["completionStatus"]["code"] == 0
    assert (
        status["retryPolicyStatus"]["totalRetriedCount"],
        status["retryPolicyStatus"]["accountableRetriedCount"],
    ) == (1, 0)  # a Transient failure is retried and not counted


def test_stop_by_merge_patch_then_delete(fc: Fc, tmp_path: Path) -> None:
    name = unique()
    pid_file = tmp_path / "pid"
    fc.create(framework(name, role("worker", f"echo $$$$ > {pid_file}; exec sleep 30")))
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the task to start")
    pid = int(pid_file.read_text())
    fc.wait(name, "AttemptRunning")

    fc.patch(name, {"spec": {"executionType": "Stop"}})
    status = fc.wait(name)["status"]
    completion = status["attemptStatus"]["completionStatus"]
    assert (completion["code"], completion["phrase"], completion["type"]) == (
        -210,
        "StopFrameworkRequested",
        {"name": "Failed", "attributes": ["Permanent"]},
    )
    assert fc.task(name)["attemptStatus"]["completionStatus"]["code"] == -210
    assert not alive(pid) and status["retryPolicyStatus"]["totalRetriedCount"] == 0

    assert fc.delete(name)["metadata"]["name"] == name
    with pytest.raises(ApiException) as gone:
        fc.get(name)
    assert gone.value.status == 404


def test_delete_kills_a_running_framework(fc: Fc, tmp_path: Path) -> None:
    name = unique()
    pid_file = tmp_path / "pid"
    body = framework(name, role("worker", f"trap '' TERM; echo $$$$ > {pid_file}; exec sleep 30"))
    body["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["terminationGracePeriodSeconds"] = 1  # then SIGKILL
    fc.create(body)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the task to start"))
    fc.delete(name)
    wait_for(lambda: not alive(pid), what="the deleted framework's process to die")


def test_azure_file_waits_for_its_secret(fc: Fc, api: client.ApiClient, azure_share: Path, mount: Path) -> None:
    name, secret = unique(), unique("azure")
    volume = [{"name": "share", "azureFile": {"secretName": secret, "shareName": "trials"}}]
    mounts = [{"name": "share", "mountPath": str(mount), "subPath": name}]
    fc.create(framework(name, role("worker", f"echo ok > {mount}/done", volumes=volume, mounts=mounts)))
    fc.wait(name, "AttemptPreparing")
    time.sleep(0.3)
    assert fc.state(name) == "AttemptPreparing" and fc.task(name)["state"] == "AttemptPreparing"

    data = {"azurestorageaccountname": "acct", "azurestorageaccountkey": "key"}
    client.CoreV1Api(api).create_namespaced_secret(
        fc.ns, client.V1Secret(metadata=client.V1ObjectMeta(name=secret), string_data=data)
    )
    assert fc.wait(name)["status"]["attemptStatus"]["completionStatus"]["code"] == 0
    assert (azure_share / name / "done").read_text() == "ok\n"


def test_unpullable_image_stays_preparing(fc: Fc) -> None:
    name = unique()
    fc.create(framework(name, role("worker", "true", image=STUCK_IMAGE)))
    fc.wait(name, "AttemptPreparing")
    time.sleep(0.3)
    assert fc.state(name) == "AttemptPreparing" and fc.task(name)["state"] == "AttemptPreparing"
    fc.patch(name, [{"op": "replace", "path": "/spec/executionType", "value": "Stop"}], "application/json-patch+json")
    assert fc.wait(name)["status"]["attemptStatus"]["completionStatus"]["code"] == -210


# ---------------------------------------------------------------- watch


def _watch(fc: Fc, into: queue.Queue[dict[str, Any]], until: str, **kw: Any) -> threading.Thread:
    """Collect the events of a watch on ``fc.ns`` in a thread, until ``until`` is DELETED."""

    def run() -> None:
        w = watch.Watch()
        try:
            for event in w.stream(fc.api.list_namespaced_custom_object, GROUP, VERSION, fc.ns, PLURAL, **kw):
                into.put(event)
                if event["type"] == "DELETED" and event["raw_object"]["metadata"]["name"] == until:
                    w.stop()
        except Exception as exc:  # handed to the test
            into.put({"type": "EXCEPTION", "error": exc})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _drain(into: queue.Queue[dict[str, Any]], thread: threading.Thread) -> list[dict[str, Any]]:
    thread.join(15)
    assert not thread.is_alive()
    events = []
    while not into.empty():
        events.append(into.get())
    assert [e for e in events if e["type"] == "EXCEPTION"] == []
    return events


def test_watch_sees_the_state_chain_and_resumes_after_a_drop(fc: Fc, k8s: Kubernetes) -> None:
    name = unique()
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    since = fc.api.list_namespaced_custom_object(GROUP, VERSION, fc.ns, PLURAL)["metadata"]["resourceVersion"]
    thread = _watch(fc, events, name, resource_version=since)
    first = fc.create(framework(name, role("worker", "sleep 0.3")))
    fc.wait(name, "AttemptRunning")
    assert k8s.drop_watches() >= 1  # the client resumes from its last resourceVersion
    fc.wait(name)
    fc.delete(name)
    seen = _drain(events, thread)

    assert [e["type"] for e in seen][:1] == ["ADDED"] and seen[-1]["type"] == "DELETED"
    versions = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in seen]
    assert versions == sorted(set(versions)) and versions[0] == int(first["metadata"]["resourceVersion"])
    states = [(e["raw_object"].get("status") or {}).get("state") for e in seen if e["type"] == "MODIFIED"]
    assert [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]] == CHAIN
    watches = [r for r in k8s.requests() if fc.ns in r["path"] and "watch=" in r["query"]]
    assert len(watches) >= 2, "the client did not resume its watch"
    assert all(f"resourceVersion={since}" not in r["query"] for r in watches[1:])

    # A fresh watch from the first resourceVersion replays exactly what the resumed watch saw.
    replay = [
        e
        for e in watch.Watch().stream(
            fc.api.list_namespaced_custom_object,
            GROUP,
            VERSION,
            fc.ns,
            PLURAL,
            resource_version=str(versions[0] - 1),
            timeout_seconds=1,
        )
    ]
    assert [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in replay] == versions


def test_watch_bookmarks_and_410_after_compaction(fc: Fc, k8s: Kubernetes) -> None:
    name = unique()
    created = fc.create(framework(name, role("worker", "true"), execution="Create"))
    old = str(int(created["metadata"]["resourceVersion"]) - 1)
    stream = watch.Watch().stream(
        fc.api.list_namespaced_custom_object,
        GROUP,
        VERSION,
        fc.ns,
        PLURAL,
        resource_version=old,
        allow_watch_bookmarks=True,
        timeout_seconds=2,
    )
    kinds = [e["type"] for e in stream]
    assert kinds[0] == "ADDED" and "BOOKMARK" in kinds

    k8s.compact()
    with pytest.raises(ApiException) as expired:
        list(
            watch.Watch().stream(
                fc.api.list_namespaced_custom_object,
                GROUP,
                VERSION,
                fc.ns,
                PLURAL,
                resource_version=old,
                timeout_seconds=2,
            )
        )
    assert expired.value.status == 410


# ---------------------------------------------------------------- secrets


def test_secret_crud(api: client.ApiClient) -> None:
    core, ns, name = client.CoreV1Api(api), unique("ns"), unique("secret")
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "trials"}),
        data={"token": base64.b64encode(b"s3cret").decode()},
        string_data={"user": "alice"},
    )
    created = core.create_namespaced_secret(ns, secret)
    assert created.metadata.uid and created.type == "Opaque"
    read = core.read_namespaced_secret(name, ns)
    assert {k: base64.b64decode(v) for k, v in read.data.items()} == {"token": b"s3cret", "user": b"alice"}
    with pytest.raises(ApiException) as dup:
        core.create_namespaced_secret(ns, secret)
    assert (dup.value.status, status_of(dup.value)["reason"]) == (409, "AlreadyExists")
    assert [s.metadata.name for s in core.list_namespaced_secret(ns, label_selector="app=trials").items] == [name]
    assert core.list_namespaced_secret(ns, label_selector="app=other").items == []
    assert core.delete_namespaced_secret(name, ns)["status"] == "Success"
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_secret(name, ns)
    assert missing.value.status == 404 and status_of(missing.value)["message"] == f'secrets "{name}" not found'
