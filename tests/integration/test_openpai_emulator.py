"""The OpenPAI emulator itself, over real HTTP: it accepts what the rest-server accepts, rejects
what it rejects (with the same codes, messages and precedence), runs jobs as real processes
and reports them the way the rest-server does.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.adapters.openpai.client import OpenpaiClient
from tests.emulators.openpai import OpenPai, start_openpai
from tests.emulators.openpai.examples import CPU_500_TASK_MNIST, HELLO_WORLD, TENSORFLOW_CIFAR10
from tests.emulators.processes import alive

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def job(name: str, *commands: str, **top: Any) -> dict[str, Any]:
    """A minimal valid job with one task role ``taskrole``."""
    return {
        "protocolVersion": 2,
        "name": name,
        "type": "job",
        "prerequisites": [{"type": "dockerimage", "uri": "ubuntu:22.04", "name": "image"}],
        "taskRoles": {
            "taskrole": {
                "instances": 1,
                "dockerImage": "image",
                "resourcePerInstance": {"cpu": 1, "memoryMB": 512, "gpu": 0},
                "commands": list(commands) or ["true"],
            }
        },
        **top,
    }


class Api:
    """httpx against ``<url>/rest-server/api/v2`` as one user."""

    def __init__(self, pai: OpenPai, user: str) -> None:
        self.pai, self.user = pai, user
        self.http = httpx.Client(base_url=pai.api, headers=pai.headers(user), timeout=10)

    def submit(self, body: dict[str, Any] | str, content_type: str = "text/yaml") -> httpx.Response:
        text = body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False)
        return self.http.post("/jobs", content=text, headers={"Content-Type": content_type})

    def detail(self, name: str, user: str | None = None) -> dict[str, Any]:
        r = self.http.get(f"/jobs/{user or self.user}~{name}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, name: str, states: tuple[str, ...] = TERMINAL, timeout: float = 15) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            detail = self.detail(name)
            if detail["jobStatus"]["state"] in states or time.monotonic() > deadline:
                assert detail["jobStatus"]["state"] in states, detail["jobStatus"]
                return detail
            time.sleep(0.05)

    def stop(self, name: str, user: str | None = None) -> httpx.Response:
        return self.http.put(f"/jobs/{user or self.user}~{name}/executionType", json={"value": "STOP"})


@pytest.fixture(scope="module")
def share(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(container path, local path): the emulator links the first to the second."""
    return tmp_path_factory.mktemp("container") / "confignfs", tmp_path_factory.mktemp("share")


@pytest.fixture(scope="module")
def pai(tmp_path_factory: pytest.TempPathFactory, share: tuple[Path, Path]) -> Iterator[OpenPai]:
    emulator = start_openpai(
        tmp_path_factory.mktemp("openpai"),
        users={"alice": "alice-password", "bob": "bob-password", "carol": "carol-password"},
        admin="carol",
        vcs={"gpu": ["alice"]},
        storages=["confignfs", "teamnfs"],
        submit_limit=10_000,
        mounts={str(share[0]): str(share[1])},
    )
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def alice(pai: OpenPai) -> Iterator[Api]:
    api = Api(pai, "alice")
    yield api
    api.http.close()


def error_of(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    return body["message"]


# ---------------------------------------------------------------- authentication


def test_login_tokens_and_both_401s(pai: OpenPai) -> None:
    with httpx.Client(base_url=pai.api) as http:
        form = http.post("/authn/basic/login", data={"username": "alice", "password": "alice-password"}).json()
        as_json = http.post("/authn/basic/login", json={"username": "carol", "password": "carol-password"}).json()
        assert set(form) == {"user", "token", "admin", "hasGitHubPAT"}
        assert (form["user"], form["admin"], as_json["admin"]) == ("alice", False, True)
        login = {"Authorization": f"Bearer {form['token']}"}

        app = http.post("/tokens/application", headers=login).json()
        assert app["application"] is True and app["token"] in http.get("/tokens", headers=login).json()["tokens"]
        bearer = {"Authorization": f"Bearer {app['token']}"}
        basic = httpx.BasicAuth("alice", app["token"])
        assert http.get("/jobs", headers=bearer).status_code == 200
        assert http.get("/jobs", auth=basic).status_code == 200
        assert (
            error_of(http.get("/tokens", headers=bearer), 403, "ForbiddenUserError")
            == "Applications are not allowed to do this operation."
        )

        assert error_of(http.get("/jobs"), 401, "UnauthorizedUserError") == "Guest is not allowed to do this operation."
        assert (
            error_of(http.get("/jobs", headers={"Authorization": "Bearer nope"}), 401, "UnauthorizedUserError")
            == "Your token is invalid."
        )
        assert http.get("/jobs", auth=httpx.BasicAuth("bob", app["token"])).status_code == 401

        assert http.delete(f"/tokens/{app['token']}", headers=login).status_code == 200
        assert error_of(http.get("/jobs", headers=bearer), 401, "UnauthorizedUserError") == "Your token is invalid."
        assert (
            error_of(http.post("/jobs", headers=bearer, content="x"), 401, "UnauthorizedUserError")
            == "Your token is invalid."
        )

        wrong = http.post("/authn/basic/login", data={"username": "alice", "password": "wrong-password"})
        assert error_of(wrong, 400, "IncorrectPasswordError")
        assert error_of(
            http.post("/authn/basic/login", data={"username": "zed", "password": "whatever"}), 400, "NoUserError"
        )
        assert error_of(
            http.post("/authn/basic/login", data={"username": "alice", "password": "short"}),
            400,
            "InvalidParametersError",
        )


def test_routes_under_both_prefixes_and_unknown_routes(pai: OpenPai, alice: Api) -> None:
    assert httpx.get(f"{pai.url}/api/v2/info").json()["launcherType"] == "k8s"
    assert httpx.get(f"{pai.url}/rest-server/api/v2/info").status_code == 200
    assert error_of(alice.http.get("/nope"), 404, "NoApiError") == "API /api/v2/nope is not found."
    assert error_of(alice.http.get("/jobs/alice~nope"), 404, "NoJobError") == "Job alice~nope is not found."
    assert error_of(alice.http.get("/jobs/alice~nope/config"), 404, "NoJobConfigError")
    assert [s["name"] for s in alice.http.get("/storages").json()["storages"]] == ["confignfs", "teamnfs"]
    assert set(alice.http.get("/virtual-clusters").json()) == {"default", "gpu"}


# ---------------------------------------------------------------- what a submission must look like


def _set(path: str, value: Any) -> Any:
    def mutate(j: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            j = j[key]
        if value is _DELETE:
            del j[last]
        else:
            j[last] = value

    return mutate


_DELETE = object()
_ROLE = "taskRoles.taskrole"
SCHEMA_CASES = {
    "unknown top-level key": (_set("retries", 3), "additionalProperties", "", {"additionalProperty": "retries"}),
    "unknown taskRole key": (
        _set(f"{_ROLE}.gpus", 1),
        "additionalProperties",
        ".taskRoles.taskrole",
        {"additionalProperty": "gpus"},
    ),
    "unknown completion key": (
        _set(f"{_ROLE}.completion", {"minFailedInstance": 1}),
        "additionalProperties",
        ".taskRoles.taskrole.completion",
        {"additionalProperty": "minFailedInstance"},
    ),
    "missing gpu": (
        _set(f"{_ROLE}.resourcePerInstance.gpu", _DELETE),
        "required",
        ".taskRoles.taskrole.resourcePerInstance",
        {"missingProperty": "gpu"},
    ),
    "no ports": (
        _set(f"{_ROLE}.resourcePerInstance.ports", {}),
        "minProperties",
        ".taskRoles.taskrole.resourcePerInstance.ports",
        {"limit": 1},
    ),
    "port label not a C identifier": (
        _set(f"{_ROLE}.resourcePerInstance.ports", {"my-port": 1}),
        "additionalProperties",
        ".taskRoles.taskrole.resourcePerInstance.ports",
        {"additionalProperty": "my-port"},
    ),
    "bad job name": (_set("name", "bad.name"), "pattern", ".name", {"pattern": "^[a-zA-Z0-9_-]+$"}),
    "bad taskRole name": (
        _set("taskRoles", {"task-role": job("x")["taskRoles"]["taskrole"]}),
        "additionalProperties",
        ".taskRoles",
        {"additionalProperty": "task-role"},
    ),
    "gpu as a string": (
        _set(f"{_ROLE}.resourcePerInstance.gpu", "1"),
        "type",
        ".taskRoles.taskrole.resourcePerInstance.gpu",
        {"type": "integer"},
    ),
    "no commands": (_set(f"{_ROLE}.commands", []), "minItems", ".taskRoles.taskrole.commands", {"limit": 1}),
    "negative jobRetryCount": (
        _set("jobRetryCount", -1),
        "minimum",
        ".jobRetryCount",
        {"comparison": ">=", "limit": 0, "exclusive": False},
    ),
    "docker image without uri": (
        _set("prerequisites", [{"type": "dockerimage", "name": "image"}]),
        "required",
        ".prerequisites[0]",
        {"missingProperty": "uri"},
    ),
    "unknown prerequisite type": (
        _set("prerequisites", [{"type": "image", "name": "image"}]),
        "oneOf",
        ".prerequisites[0]",
        {"passingSchemas": None},
    ),
}


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=list(SCHEMA_CASES))
def test_rejects_what_the_server_schema_rejects(alice: Api, case: str) -> None:
    mutate, keyword, data_path, params = SCHEMA_CASES[case]
    body = job(unique("schema"))
    mutate(body)
    errors = json.loads(error_of(alice.submit(body), 400, "InvalidProtocolError"))
    assert {"keyword": keyword, "dataPath": data_path, "params": params} in [
        {k: e[k] for k in ("keyword", "dataPath", "params")} for e in errors
    ], errors


def test_accepts_what_the_published_schema_would_not(alice: Api) -> None:
    # version as a number, no prerequisites needed by the server, completion values null
    body = job(unique("loose"), version=1.0)
    body["taskRoles"]["taskrole"]["completion"] = {"minFailedInstances": None, "minSucceededInstances": None}
    assert alice.submit(body).status_code == 202


SEMANTIC_CASES = {
    "undefined docker image": (_set(f"{_ROLE}.dockerImage", "nope"), "Prerequisite nope does not exist."),
    "undefined role prerequisite": (
        _set(f"{_ROLE}.prerequisites", ["missing"]),
        "Prerequisite missing does not exist.",
    ),
    "duplicate prerequisite": (
        _set("prerequisites", [{"type": "dockerimage", "uri": "a", "name": "image"}] * 2),
        "Duplicate dockerimage prerequisites image.",
    ),
    "duplicate deployment": (
        _set("deployments", [{"name": "d", "taskRoles": {"taskrole": {"preCommands": ["a"]}}}] * 2),
        "Duplicate deployments d.",
    ),
    "undefined default deployment": (_set("defaults", {"deployment": "d"}), "Default deployment d does not exist."),
}


@pytest.mark.parametrize("case", SEMANTIC_CASES, ids=list(SEMANTIC_CASES))
def test_rejects_broken_references(alice: Api, case: str) -> None:
    mutate, message = SEMANTIC_CASES[case]
    body = job(unique("refs"))
    mutate(body)
    assert error_of(alice.submit(body), 400, "InvalidProtocolError") == message


def test_body_must_be_text(alice: Api) -> None:
    body = job(unique("json"))
    errors = json.loads(error_of(alice.submit(json.dumps(body), "application/json"), 400, "InvalidProtocolError"))
    assert errors[0]["message"] == "should be object"  # js-yaml read the text "[object Object]"
    assert alice.submit(json.dumps(body), "text/plain").status_code == 202  # JSON is YAML


def test_malformed_yaml_is_a_500_without_code(alice: Api) -> None:
    r = alice.submit("protocolVersion: 2\nname: [unclosed\ntype: job\n")
    assert r.status_code == 500 and set(r.json()) == {"message"}
    assert alice.submit("name: a\nname: b\n").status_code == 500  # js-yaml refuses duplicate keys


def test_name_conflict_also_after_the_job_finished(alice: Api) -> None:
    name = unique("conflict")
    r = alice.submit(job(name))
    assert r.status_code == 202 and r.json() == {
        "status": 202,
        "message": f"Update job {name} for user alice successfully.",
    }
    assert error_of(alice.submit(job(name)), 409, "ConflictJobError") == f"Job alice~{name} already exists."
    alice.wait(name, ("SUCCEEDED",))
    assert error_of(alice.submit(job(name)), 409, "ConflictJobError") == f"Job alice~{name} already exists."


def test_virtual_cluster_access(pai: OpenPai, alice: Api) -> None:
    bob, carol = Api(pai, "bob"), Api(pai, "carol")
    gpu_job = job(unique("vc"), defaults={"virtualCluster": "gpu"})
    assert error_of(bob.submit(gpu_job), 403, "ForbiddenUserError") == "User bob is not allowed to do operation in gpu"
    assert alice.submit(gpu_job).status_code == 202
    assert carol.submit(gpu_job).status_code == 202  # admins use every virtual cluster
    assert error_of(alice.submit(job(unique("vc"), defaults={"virtualCluster": "nope"})), 403, "ForbiddenUserError")
    assert alice.detail(gpu_job["name"])["jobStatus"]["virtualCluster"] == "gpu"
    bob.http.close()
    carol.http.close()


def test_unknown_storage_is_a_404(alice: Api) -> None:
    known = {"storages": [{"name": "teamnfs", "mountPath": "/mnt/team"}]}
    assert alice.submit(job(unique("st"), extras=known)).status_code == 202
    bad = {"storages": [{"name": "nope"}]}
    assert error_of(alice.submit(job(unique("st"), extras=bad)), 404, "NoStorageError")
    plugin = {
        "com.microsoft.pai.runtimeplugin": [
            {"plugin": "teamwise_storage", "parameters": {"storageConfigNames": ["nope"]}}
        ]
    }
    assert error_of(alice.submit(job(unique("st"), extras=plugin)), 404, "NoStorageError")


def test_error_precedence(alice: Api) -> None:
    # schema before references, references before conflict, conflict before VC, VC before storage
    name = unique("order")
    assert alice.submit(job(name)).status_code == 202
    broken = job(name, defaults={"virtualCluster": "nope"}, extras={"storages": [{"name": "nope"}]})
    broken["taskRoles"]["taskrole"]["dockerImage"] = "missing"
    assert error_of(alice.submit({**broken, "oops": 1}), 400, "InvalidProtocolError").startswith("[")
    assert error_of(alice.submit(broken), 400, "InvalidProtocolError") == "Prerequisite missing does not exist."
    broken["taskRoles"]["taskrole"]["dockerImage"] = "image"
    assert error_of(alice.submit(broken), 409, "ConflictJobError")
    assert error_of(alice.submit({**broken, "name": unique("order")}), 403, "ForbiddenUserError")


def test_submissions_are_rate_limited_per_user(tmp_path: Path) -> None:
    with start_openpai(tmp_path, users={"alice": "alice-password", "bob": "bob-password"}, submit_limit=2) as pai:
        alice, bob = Api(pai, "alice"), Api(pai, "bob")
        assert alice.submit(job(unique("rl"))).status_code == 202
        assert alice.submit("not: [valid").status_code == 500  # failed submissions count too
        r = alice.submit(job(unique("rl")))
        assert r.status_code == 429 and r.headers["content-type"].startswith("text/plain") and r.text
        assert bob.submit(job(unique("rl"))).status_code == 202
        alice.http.close()
        bob.http.close()


def test_the_adapter_s_client_reads_each_virtual_cluster_s_gpus(tmp_path: Path) -> None:
    async def read(pai: OpenPai) -> tuple[dict[str, float], dict[str, float]]:
        client = OpenpaiClient(pai.url, "alice", pai.token("alice"), None, 5.0, 60.0)
        try:
            assert client.virtual_clusters_due(60.0)
            first = await client.read_virtual_clusters()
            assert not client.virtual_clusters_due(60.0) and client.virtual_clusters_at is not None
            pai.stop()
            again = await client.read_virtual_clusters()  # cannot reach it: the last answer stays
            return first, again
        finally:
            await client.close()

    with start_openpai(tmp_path, vc_gpus={"default": 8, "vision": 4}) as pai:
        assert asyncio.run(read(pai)) == ({"default": 8, "vision": 4}, {"default": 8, "vision": 4})


# ---------------------------------------------------------------- the published examples


def test_accepts_the_published_examples(tmp_path: Path) -> None:
    # A long lag keeps them AttemptCreationPending (nothing runs), the mock status of a new job.
    with start_openpai(tmp_path, lag=60) as pai:
        alice = Api(pai, "alice")
        for text in (HELLO_WORLD, CPU_500_TASK_MNIST, TENSORFLOW_CIFAR10):
            name = yaml.safe_load(text)["name"]
            assert alice.submit(text).status_code == 202, name
            status = alice.detail(name)["jobStatus"]
            assert (status["state"], status["subState"], status["attemptId"], status["retries"]) == (
                "WAITING",
                "AttemptCreationPending",
                None,
                0,
            )
            assert alice.stop(name).status_code == 202
            stopped = alice.wait(name, ("STOPPED",))["jobStatus"]
            assert (stopped["appExitCode"], stopped["appExitSpec"]["phrase"]) == (-210, "StopFrameworkRequested")
        config = yaml.safe_load(alice.http.get("/jobs/alice~tensorflow_cifar10/config").text)
        assert config["deployments"][0]["taskRoles"]["worker"]["preCommands"][0].startswith("wget -qO- <% $data")
        listed = alice.http.get("/jobs", params={"withTotalCount": "true", "order": "jobName,ASC"}).json()
        assert listed["totalCount"] == 3 and [j["name"] for j in listed["data"]][0] == "CPU_500Task_MNIST"
        assert listed["data"][0]["totalTaskNumber"] == 501
        alice.http.close()


# ---------------------------------------------------------------- running jobs


def test_a_job_runs_to_succeeded(alice: Api, share: tuple[Path, Path]) -> None:
    name = unique("ok")
    container, local = share
    assert alice.submit(job(name, "echo started", f"echo $PAI_JOB_NAME > {container}/{name}.out")).status_code == 202
    detail = alice.wait(name, ("SUCCEEDED",))
    status, task = detail["jobStatus"], detail["taskRoles"]["taskrole"]["taskStatuses"][0]
    assert (status["subState"], status["appExitCode"], status["appExitType"], status["attemptId"]) == (
        "Completed",
        0,
        "Succeeded",
        0,
    )
    assert status["appExitSpec"]["type"] == "USER_SUCCESS"
    assert status["submissionTime"] <= status["launchedTime"] <= status["completedTime"]
    assert (task["taskState"], task["containerExitCode"], task["containerIp"]) == ("SUCCEEDED", 0, "127.0.0.1")
    assert set(task["containerPorts"]) == {"ssh", "http"}
    assert (local / f"{name}.out").read_text() == f"alice~{name}\n"  # reached through the mount
    logs = alice.http.get(task["containerLog"].removeprefix("/api/v2")).json()["locations"]
    stdout = next(loc["uri"] for loc in logs if loc["name"] == "stdout")
    assert httpx.get(stdout).text == "started\n"


def test_a_failing_command_fails_the_job(alice: Api) -> None:
    name = unique("fail")
    assert alice.submit(job(name, "echo before", "no-such-command-xyz")).status_code == 202
    status = alice.wait(name)["jobStatus"]
    assert (status["state"], status["appExitCode"], status["retries"]) == ("FAILED", 220, 0)
    assert status["appExitSpec"]["type"] == "USER_FAILURE"
    assert status["appExitSpec"]["phrase"] == "UserCommandExitWithError"
    assert (status["appExitTriggerTaskRoleName"], status["appExitTriggerTaskIndex"]) == ("taskrole", 0)
    runtime = status["appExitMessages"]["runtime"]
    assert (runtime["exitCode"], runtime["originUserExitCode"]) == (220, 127)
    assert "command not found" in runtime["errorLogs"]["user"]
    failed = alice.http.get("/jobs", params={"state": "FAILED", "keyword": name}).json()
    assert [j["name"] for j in failed] == [name]


def test_unrecognised_exit_codes_retry_up_to_job_retry_count(alice: Api) -> None:
    # exit 3 matches no runtime pattern: 255 PAIRuntimeUnknownFailed, RETRY_TO_MAX
    name = unique("unknown")
    assert alice.submit(job(name, "exit 3", jobRetryCount=1)).status_code == 202
    status = alice.wait(name)["jobStatus"]
    assert (status["state"], status["appExitCode"], status["appExitSpec"]["type"]) == ("FAILED", 255, "UNKNOWN_FAILURE")
    assert (status["retries"], status["retryDetails"], status["attemptId"]) == (
        1,
        {"user": 1, "platform": 0, "resource": 0},
        1,
    )
    first = alice.http.get(f"/jobs/alice~{name}/attempts/0").json()["jobStatus"]
    assert (first["attemptState"], first["appExitCode"]) == ("FAILED", 255)


def test_task_retry_count_needs_gang_allocation_off(alice: Api) -> None:
    # PAI issue #5004: taskRetryCount is ignored unless extras.gangAllocation is false
    ignored, honoured = unique("gang"), unique("nogang")
    body = job(ignored, "exit 3")
    body["taskRoles"]["taskrole"]["taskRetryCount"] = 2
    assert alice.submit(body).status_code == 202
    assert alice.submit({**body, "name": honoured, "extras": {"gangAllocation": False}}).status_code == 202
    tasks = {
        name: alice.wait(name, ("FAILED",))["taskRoles"]["taskrole"]["taskStatuses"][0] for name in (ignored, honoured)
    }
    assert (tasks[ignored]["retries"], tasks[honoured]["retries"], tasks[honoured]["attemptId"]) == (0, 2, 2)
    assert tasks[honoured]["containerExitCode"] == 255


def test_sigkill_is_transient_and_retried_even_without_job_retry_count(alice: Api, share: tuple[Path, Path]) -> None:
    name = unique("sigkill")
    mark = f"{share[0]}/{name}.mark"
    command = f"if [ ! -e {mark} ]; then touch {mark}; kill -9 $$; fi; echo second attempt"
    assert alice.submit(job(name, command, jobRetryCount=0)).status_code == 202
    status = alice.wait(name)["jobStatus"]
    assert (status["state"], status["retries"], status["attemptId"]) == ("SUCCEEDED", 1, 1)
    assert status["retryDetails"] == {"user": 0, "platform": 1, "resource": 0}
    first = alice.http.get(f"/jobs/alice~{name}/attempts/0").json()["jobStatus"]
    assert (first["appExitCode"], first["appExitSpec"]["reaction"]) == (137, "ALWAYS_RETRY")
    assert (
        error_of(alice.http.get(f"/jobs/alice~{name}/attempts/7"), 404, "NoJobError")
        == f"JobAttemptId 7 is not found in alice~{name}."
    )


def test_stop_kills_the_tasks(pai: OpenPai, alice: Api, share: tuple[Path, Path]) -> None:
    name = unique("stop")
    pid_file = share[1] / f"{name}.pid"
    assert alice.submit(job(name, f"echo $$ > {share[0]}/{name}.pid", "sleep 300")).status_code == 202
    alice.wait(name, ("RUNNING",))
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(pid_file.read_text())

    bob, carol = Api(pai, "bob"), Api(pai, "carol")
    assert error_of(bob.stop(name, user="alice"), 403, "ForbiddenUserError")
    bad = alice.http.put(f"/jobs/alice~{name}/executionType", json={"value": "PAUSE"})
    assert error_of(bad, 400, "InvalidParametersError")
    assert error_of(alice.stop("nope"), 404, "NoJobError")
    r = carol.stop(name, user="alice")  # an admin may stop anyone's job
    assert r.status_code == 202 and r.json() == {"status": 202, "message": f"Execute job alice~{name} successfully."}
    status = alice.detail(name)["jobStatus"]  # the stop is asynchronous, as on a cluster
    assert status["executionType"] == "STOP" and status["state"] in ("RUNNING", "STOPPING", "STOPPED")
    status = alice.wait(name, ("STOPPED",))["jobStatus"]
    assert (status["executionType"], status["appExitCode"], status["appExitType"]) == ("STOP", -210, "Failed")
    assert status["appExitSpec"]["type"] == "USER_STOP"
    assert not alive(pid)
    assert alice.stop(name).status_code == 202  # stopping again is harmless
    bob.http.close()
    carol.http.close()


def test_two_task_roles_see_their_environment(alice: Api, share: tuple[Path, Path]) -> None:
    name = unique("env")
    container, local = share
    out = f"{container}/{name}"
    body = job(name)
    role = body["taskRoles"]["taskrole"]
    barrier = f"mkdir -p {out}; env | grep -E '^(PAI_|NVIDIA_)' > {out}/$PAI_CURRENT_TASK_ROLE_NAME-$PAI_TASK_INDEX.env"
    wait_all = f"for i in $(seq 200); do [ $(ls {out} | wc -l) -ge 3 ] && break; sleep 0.05; done"
    role["commands"] = [barrier, wait_all]
    worker = copy.deepcopy(role)
    worker["instances"] = 2
    worker["resourcePerInstance"] = {"cpu": 2, "memoryMB": 1024, "gpu": 0, "ports": {"rpc": 2}}
    worker["extraContainerOptions"] = {"shmMB": 128}
    body["taskRoles"] = {"master": role, "worker": worker}
    assert alice.submit(body).status_code == 202
    detail = alice.wait(name, ("SUCCEEDED",))

    def env(role_name: str, index: int) -> dict[str, str]:
        lines = (local / name / f"{role_name}-{index}.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines)

    w1 = env("worker", 1)
    assert w1["PAI_JOB_NAME"] == w1["PAI_FRAMEWORK_NAME"] == f"alice~{name}"
    assert (w1["PAI_USER_NAME"], w1["PAI_VIRTUAL_CLUSTER"], w1["PAI_DEFAULT_FS_URI"]) == ("alice", "default", "")
    assert (w1["PAI_TASK_ROLE_COUNT"], w1["PAI_TASK_ROLE_LIST"]) == ("2", "master,worker")
    assert (w1["PAI_TASK_ROLE_TASK_COUNT_worker"], w1["PAI_TASK_ROLE_TASK_COUNT_master"]) == ("2", "1")
    assert (w1["PAI_RESOURCE_worker"], w1["PAI_RESOURCE_master"]) == ("0,2,1024,128", "0,1,512,0")
    assert (w1["PAI_MIN_FAILED_TASK_COUNT_worker"], w1["PAI_MIN_SUCCEEDED_TASK_COUNT_worker"]) == ("1", "2")
    assert (w1["PAI_CURRENT_TASK_ROLE_NAME"], w1["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"]) == ("worker", "1")
    assert (w1["PAI_TASK_INDEX"], w1["PAI_CURRENT_CONTAINER_IP"], w1["NVIDIA_VISIBLE_DEVICES"]) == (
        "1",
        "127.0.0.1",
        "none",
    )
    assert env("master", 0)["PAI_CURRENT_TASK_ROLE_NAME"] == "master"
    assert env("worker", 0)["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == "0"

    tasks = detail["taskRoles"]["worker"]["taskStatuses"]
    ports = tasks[1]["containerPorts"]
    assert len(ports["rpc"].split(",")) == 2 and set(ports) == {"rpc", "ssh", "http"}
    assert w1["PAI_PORT_LIST_worker_1_rpc"] == ports["rpc"] == w1["PAI_CONTAINER_HOST_rpc_PORT_LIST"]
    assert w1["PAI_CONTAINER_HOST_PORT_LIST"] == f"rpc:{ports['rpc']};ssh:{ports['ssh']};http:{ports['http']};"
    assert w1["PAI_HOST_IP_master_0"] == w1["PAI_HOST_IP_worker_0"] == "127.0.0.1"
    assert w1["PAI_TASK_ROLE_worker_HOST_LIST"] == ",".join(f"127.0.0.1:{t['containerPorts']['http']}" for t in tasks)
    assert w1["PAI_WORK_DIR"] != env("worker", 0)["PAI_WORK_DIR"]  # every task has its own directory


def test_secrets_are_rendered_at_run_time_and_masked(alice: Api, share: tuple[Path, Path]) -> None:
    name = unique("secret")
    container, local = share
    command = f"echo '<% $secrets.token %>/<% $parameters.lr %>/<% $secrets.nope %>' > {container}/{name}.out"
    body = job(name, command, secrets={"token": "s3cret"}, parameters={"lr": 0.5})
    assert alice.submit(body).status_code == 202
    alice.wait(name, ("SUCCEEDED",))
    assert (local / f"{name}.out").read_text() == "s3cret/0.5/\n"
    r = alice.http.get(f"/jobs/alice~{name}/config")
    assert r.headers["content-type"].startswith("text/yaml")
    config = yaml.safe_load(r.text)
    assert config["secrets"] == "******" and config["parameters"] == {"lr": 0.5}
    assert config["taskRoles"]["taskrole"]["commands"] == [command]


def test_lag_keeps_a_new_job_waiting(tmp_path: Path) -> None:
    with start_openpai(tmp_path, lag=1.0) as pai:
        alice = Api(pai, "alice")
        name = unique("lag")
        assert alice.submit(job(name)).status_code == 202
        status = alice.detail(name)["jobStatus"]
        assert (status["state"], status["subState"], status["attemptId"]) == ("WAITING", "AttemptCreationPending", None)
        assert alice.detail(name)["taskRoles"] == {}
        status = alice.wait(name, ("SUCCEEDED",))["jobStatus"]
        assert status["createdTime"] - status["submissionTime"] >= 900
        alice.http.close()


def test_job_list_filters_and_limits(alice: Api) -> None:
    names = [unique("list") for _ in range(3)]
    for name in names:
        assert alice.submit(job(name)).status_code == 202
    listed = alice.http.get(
        "/jobs",
        params={
            "username": "alice",
            "keyword": "list-",
            "order": "submissionTime,ASC",
            "offset": 1,
            "limit": 2,
            "withTotalCount": "true",
        },
    ).json()
    assert listed["totalCount"] >= 3 and len(listed["data"]) == 2
    mine = [j["name"] for j in alice.http.get("/jobs", params={"keyword": names[0]}).json()]
    assert mine == [names[0]]
    assert alice.http.get("/jobs", params={"username": "nobody"}).json() == []
    assert error_of(alice.http.get("/jobs", params={"limit": 50001}), 400, "InvalidParametersError")
    summary = alice.http.get("/jobs", params={"keyword": names[0]}).json()[0]
    assert {
        "name",
        "username",
        "state",
        "subState",
        "executionType",
        "retries",
        "createdTime",
        "completedTime",
        "appExitCode",
        "virtualCluster",
        "totalGpuNumber",
        "totalTaskNumber",
        "debugId",
    } <= set(summary)


def test_stop_kills_job_processes_even_after_a_server_crash(tmp_path: Path) -> None:
    pai = start_openpai(tmp_path)
    alice = Api(pai, "alice")
    name = unique("orphan")
    pid_file = tmp_path / f"{name}.pid"
    assert alice.submit(job(name, f"echo $$ > {pid_file}", "sleep 300")).status_code == 202
    alice.wait(name, ("RUNNING",))
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(pid_file.read_text())
    alice.http.close()
    pai.process.send_signal(signal.SIGKILL)
    pai.process.wait()
    assert alive(pid)  # the task outlived its server...
    pai.stop()
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:  # ...until the launcher killed its process group
        time.sleep(0.02)
    assert not alive(pid)
