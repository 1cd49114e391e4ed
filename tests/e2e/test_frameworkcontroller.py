"""The frameworkcontroller adapter end to end, against the Kubernetes emulator over real HTTP,
through the official client: each trial a Framework, status from a watch.

The emulator (``tests/emulators/kubernetes``) runs each task's pod as local processes; the
NFS volume is a folder here that the adapter writes to (``TRIALBUS_SHARE_MOUNTS``) and the
"pods" reach at ``containerMountPath`` (a link the emulator makes).
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import httpx
import kubernetes
import pytest
import yaml

from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.e2e.test_openpai import TRIAL
from tests.emulators.kubernetes import start_kubernetes
from tests.fixtures.nats import free_port
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(240)

NFS = "nfs://nfs.test/export"
TEST_AGENT = "trialbus-e2e-test"
RBAC = Path(__file__).resolve().parents[2] / "k8s" / "base" / "frameworkcontroller-rbac.yaml"
AZURE_KEY = "azure-key-" + secrets.token_hex(8)


@pytest.fixture
def share(tmp_path: Path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    return folder


@pytest.fixture
def k8s(tmp_path: Path, share: Path):
    emulator = start_kubernetes(
        tmp_path / "k8s",
        token="t0ken",
        stuck_images={"never/pulls:1"},
        volumes={NFS: str(share), "azurefile://trials": str(share)},
    )
    yield emulator
    emulator.stop()


def fc_stack(tmp_path: Path, nats_server, k8s, share: Path, **env: str) -> Stack:
    mounts = {NFS: str(share), "azurefile://acct/trials": str(share)}
    return Stack(
        root=tmp_path,
        nats=nats_server,
        extra_env={
            "TRIALBUS_KUBECONFIG": str(k8s.kubeconfig(tmp_path / "kubeconfig")),
            "TRIALBUS_SHARE_MOUNTS": json.dumps(mounts),
            "TRIALBUS_AZURE_STORAGE_KEY": AZURE_KEY,
            "TRIALBUS_WATCH_TIMEOUT": "5",
            "TRIALBUS_STATUS_INTERVAL": "0.5",
            **env,
        },
    )


@pytest.fixture
def stack(tmp_path: Path, nats_server, k8s, share: Path, request):
    found = fc_stack(tmp_path, nats_server, k8s, share, TRIALBUS_RELIST_INTERVAL="300")
    found.start("dispatcher", "gateway", "frameworkcontroller")
    yield found
    found.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(found.logs(), k8s.log()[-4000:], file=sys.stderr)


def fc_config(code: Path, **service) -> dict:
    return {
        "experimentName": "fc-e2e",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 4,
        "trainingService": {
            "platform": "frameworkcontroller",
            "namespace": "default",
            "storage": {"storageType": "nfs", "server": "nfs.test", "path": "/export"},
            "containerMountPath": f"/tmp/tb-fc-{secrets.token_hex(4)}",
            "taskRoles": [
                {
                    "name": "worker",
                    "taskNumber": 1,
                    "command": "python3 trial.py",
                    "cpuNumber": 1,
                    "memorySize": "512mb",
                    "dockerImage": "python:3.11",
                }
            ],
            **service,
        },
    }


def api_client(k8s) -> kubernetes.client.ApiClient:
    """The test's own client (its User-Agent tells its calls from the adapter's)."""
    client = kubernetes.client.ApiClient(k8s.configuration())
    client.user_agent = TEST_AGENT
    return client


def frameworks(k8s) -> list[dict]:
    api = kubernetes.client.CustomObjectsApi(api_client(k8s))
    found = api.list_namespaced_custom_object("frameworkcontroller.microsoft.com", "v1", "default", "frameworks")
    return found["items"]


def within_the_role(requests: list[dict]) -> None:
    """Every API call the adapter made is granted by k8s/base/frameworkcontroller-rbac.yaml."""
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "Role")
    granted = {
        (rule["apiGroups"][0], resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    used = set()
    for request in requests:
        if request["agent"] == TEST_AGENT:
            continue  # the test's own calls
        parts = request["path"].strip("/").split("/")
        if len(parts) < 2:
            continue  # discovery of the API groups (``/apis``: whether Kueue is installed)
        group = parts[1] if parts[0] == "apis" else ""
        rest = parts[3:] if parts[0] == "apis" else parts[2:]
        if len(rest) < 3 or rest[0] != "namespaces":
            continue  # discovery
        named = len(rest) > 3
        watch = "watch=true" in str(request.get("query", "")).lower()
        verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}.get(
            request["method"], "get" if named else "watch" if watch else "list"
        )
        used.add((group, rest[2], verb))
    assert used and used <= granted, used - granted


def test_twenty_trials_run_as_frameworks_and_every_metric_arrives(stack, k8s, tmp_path):
    experiment = create(stack, fc_config(write_code(tmp_path, TRIAL)))
    ids = [submit(stack, experiment, {"x": i, "intermediate": 2}) for i in range(20)]
    finals = [ended(stack, t, timeout=180) for t in ids]
    assert [t["status"] for t in finals] == ["SUCCEEDED"] * 20, [t["message"] for t in finals]
    assert [t["finalMetric"]["default"] for t in finals] == list(range(20))
    for trial_id in ids[:5]:
        records = stack.rest("GET", f"/trials/{trial_id}/metrics").json()
        assert [(r["type"], r["sequence"]) for r in records] == [("PERIODICAL", 0), ("PERIODICAL", 1), ("FINAL", 0)]
    wait_until(lambda: frameworks(k8s) == [], 30, "every Framework deleted once its trial's end is published")
    log = stack.rest("GET", f"/trials/{ids[0]}/log")
    assert log.status_code == 200 and "==> worker-0/stdout <==" in log.text, log.text


def test_a_failing_task_fails_a_two_role_trial_by_its_completion_policy(stack, k8s, tmp_path):
    roles = [
        {"name": "worker", "taskNumber": 1, "command": "python3 trial.py", "cpuNumber": 1, "memorySize": "512mb"},
        {
            "name": "ps",
            "taskNumber": 2,
            "cpuNumber": 1,
            "memorySize": "512mb",
            "command": 'test "$FC_TASK_INDEX" != 1 || exit 7; sleep 60',
            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceedTaskCount": -1},
        },
    ]
    config = fc_config(write_code(tmp_path, TRIAL), taskRoles=roles, reportingTaskRole="worker")
    experiment = create(stack, config)
    found = ended(stack, submit(stack, experiment, {"x": 1, "sleep": 60}))
    assert found["status"] == "FAILED", found
    assert "completion code 7 (ContainerUnrecognizedFailed, unknown)" in found["message"], found["message"]
    assert "FailedTaskCount 1 has reached MinFailedTaskCount 1 in the TaskRole" in found["message"]


def test_cancel_stops_the_framework_and_someone_else_s_delete_is_sys_canceled(stack, k8s, tmp_path):
    experiment = create(stack, fc_config(write_code(tmp_path, TRIAL)))
    canceled, deleted = (submit(stack, experiment, {"x": i, "sleep": 60}) for i in range(2))
    for trial_id in (canceled, deleted):
        wait_until(lambda t=trial_id: trial(stack, t)["status"] == "RUNNING", 30, "RUNNING")
    wait_until(lambda: len(frameworks(k8s)) == 2, 30, "both Frameworks")
    assert stack.rest("POST", f"/trials/{canceled}/cancel").status_code == 202
    assert ended(stack, canceled)["status"] == "USER_CANCELED"
    (other,) = [f for f in frameworks(k8s) if f["metadata"]["labels"]["trialbus.io/trial"] == deleted]
    api = kubernetes.client.CustomObjectsApi(api_client(k8s))
    api.delete_namespaced_custom_object(
        "frameworkcontroller.microsoft.com", "v1", "default", "frameworks", other["metadata"]["name"]
    )
    found = ended(stack, deleted)
    assert found["status"] == "SYS_CANCELED" and "deleted outside Trialbus" in found["message"], found
    wait_until(lambda: frameworks(k8s) == [], 30, "the stopped Framework deleted after its end")
    within_the_role(k8s.requests())


def test_the_watch_resumes_after_a_dropped_stream_and_relists_after_a_410(stack, k8s, tmp_path):
    experiment = create(stack, fc_config(write_code(tmp_path, TRIAL)))
    first = submit(stack, experiment, {"x": 1, "sleep": 2})
    wait_until(lambda: trial(stack, first)["status"] == "RUNNING", 30, "RUNNING")
    assert k8s.drop_watches() >= 1
    assert ended(stack, first, timeout=30)["status"] == "SUCCEEDED", "the resumed watch saw the end"
    second = submit(stack, experiment, {"x": 2, "sleep": 2})
    wait_until(lambda: trial(stack, second)["status"] == "RUNNING", 30, "RUNNING")
    k8s.compact()
    k8s.drop_watches()
    assert ended(stack, second, timeout=30)["status"] == "SUCCEEDED", "a list after the 410 saw the end"


def test_a_restarted_adapter_adopts_its_frameworks(stack, k8s, tmp_path):
    experiment = create(stack, fc_config(write_code(tmp_path, TRIAL)))
    ids = [submit(stack, experiment, {"x": i, "intermediate": 1, "sleep": 3}) for i in range(2)]
    for trial_id in ids:
        wait_until(lambda t=trial_id: trial(stack, t)["status"] == "RUNNING", 30, "RUNNING")
    stack.kill("frameworkcontroller")
    stack.start("frameworkcontroller")
    for trial_id in ids:
        found = ended(stack, trial_id)
        assert found["status"] == "SUCCEEDED" and found["intermediateCount"] == 1, found


def test_a_framework_stuck_preparing_says_so_then_fails(tmp_path, nats_server, k8s, share):
    stack = fc_stack(tmp_path, nats_server, k8s, share, TRIALBUS_QUEUE_NOTE_AFTER="0.5")
    try:
        stack.start("dispatcher", "gateway", "frameworkcontroller")
        roles = [
            {
                "name": "worker",
                "taskNumber": 1,
                "command": "python3 trial.py",
                "cpuNumber": 1,
                "memorySize": "512mb",
                "dockerImage": "never/pulls:1",
            }
        ]
        experiment = create(stack, fc_config(write_code(tmp_path, TRIAL), taskRoles=roles, preparingTimeout="4s"))
        trial_id = submit(stack, experiment, {"x": 1})
        wait_until(
            lambda: "is AttemptPreparing (waiting for its pods)" in (trial(stack, trial_id)["message"] or ""),
            30,
            "the note",
        )
        found = ended(stack, trial_id)
        assert found["status"] == "FAILED" and "stayed AttemptPreparing for" in found["message"], found
    finally:
        stack.stop()


def test_azure_storage_gets_a_secret_that_goes_with_the_experiment(stack, k8s, tmp_path):
    storage = {"storageType": "azureStorage", "azureAccount": "acct", "azureShare": "trials"}
    experiment = create(stack, fc_config(write_code(tmp_path, TRIAL), storage=storage))
    core = kubernetes.client.CoreV1Api(api_client(k8s))
    assert ended(stack, submit(stack, experiment, {"x": 1}))["status"] == "SUCCEEDED"
    (secret,) = core.list_namespaced_secret("default").items
    assert secret.metadata.name == f"trialbus-{experiment}-azure"
    assert stack.rest("DELETE", f"/experiments/{experiment}").status_code in (200, 202)
    wait_until(lambda: core.list_namespaced_secret("default").items == [], 30, "the Secret deleted")
    everything = "".join(stack.log(n) for n in ("dispatcher", "gateway", "frameworkcontroller")) + k8s.log()
    assert AZURE_KEY not in everything
    within_the_role(k8s.requests())


def test_bad_settings_are_refused_at_creation(tmp_path, nats_server, share):
    no_fc = start_kubernetes(tmp_path / "k8s", token="t0ken", serve_crd=False, volumes={NFS: str(share)})
    stack = fc_stack(tmp_path, nats_server, no_fc, share)
    try:
        stack.start("dispatcher", "gateway", "frameworkcontroller")
        code = write_code(tmp_path, TRIAL)
        cases = {
            "no FrameworkController": (fc_config(code), "FrameworkController is not installed in this cluster"),
            "storage not mounted": (
                fc_config(code, storage={"storageType": "nfs", "server": "x", "path": "/y"}),
                "storage nfs://x/y is not mounted on the adapter's host",
            ),
            "no such role": (
                fc_config(
                    code,
                    taskRoles=[
                        *fc_config(code)["trainingService"]["taskRoles"],
                        {**fc_config(code)["trainingService"]["taskRoles"][0], "name": "ps"},
                    ],
                    reportingTaskRole="chief",
                ),
                "reportingTaskRole 'chief' is not a task role of taskRoles (worker, ps)",
            ),
        }
        for name, (config, reason) in cases.items():
            reply = stack.rest("POST", "/experiments", json=config)
            assert reply.status_code in (400, 422) and reason in reply.json()["error"], (name, reply.text)
    finally:
        stack.stop()
        no_fc.stop()


def test_an_adapter_without_a_cluster_starts_idle_and_says_why(tmp_path, nats_server, share):
    stack = Stack(
        root=tmp_path,
        nats=nats_server,
        extra_env={
            "TRIALBUS_KUBECONFIG": str(tmp_path / "nope"),
            "TRIALBUS_SHARE_MOUNTS": json.dumps({NFS: str(share)}),
        },
    )
    try:
        stack.start("dispatcher", "gateway", "frameworkcontroller")
        reply = stack.rest("POST", "/experiments", json=fc_config(write_code(tmp_path, TRIAL)))
        assert reply.status_code == 422, reply.text
        assert f"no Kubernetes configuration: {tmp_path / 'nope'} does not exist" in reply.json()["error"]
    finally:
        stack.stop()


def test_the_adapter_s_health_says_it_is_idle_without_a_cluster(tmp_path, nats_server):
    port = free_port()
    no_cluster = {"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": "", "HOME": str(tmp_path)}
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={**no_cluster, "TRIALBUS_ADAPTER_HTTP_PORT": str(port)})
    try:
        stack.start("frameworkcontroller")
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
        assert health["status"] == "ok" and health["idle"] is True, health
        assert health["cluster"].startswith("not configured: set KUBECONFIG"), health
    finally:
        stack.stop()
