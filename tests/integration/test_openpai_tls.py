"""The openpai adapter and a cluster with a self-signed HTTPS certificate (the emulator over TLS).

Certificates are always verified. Given ``TRIALBUS_OPENPAI_CA_BUNDLE`` (the cluster's CA), every
call works; with the system's CAs, or another CA's bundle, every call fails for good with a
message that names the setting: never a silent ``verify=False``, never retries that cannot help.
The last two tests run the whole stack the same way, as a user would meet it.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from services.adapters.errors import PermanentError, TransientError
from services.adapters.openpai.client import OpenpaiClient
from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit
from tests.e2e.test_openpai import TRIAL
from tests.emulators.openpai import OpenPai, start_openpai
from tests.fixtures.nats import free_port
from tests.fixtures.openpai import openpai_config, share  # noqa: F401 - share is a fixture
from tests.fixtures.stack import Stack
from tests.fixtures.tls import Certificates, certificates, make_certificates  # noqa: F401 - certificates too

HINT = "set TRIALBUS_OPENPAI_CA_BUNDLE"


def job_yaml(name: str) -> str:
    """A minimal job of one task that succeeds at once."""
    return yaml.safe_dump(
        {
            "protocolVersion": 2,
            "name": name,
            "type": "job",
            "prerequisites": [{"type": "dockerimage", "uri": "ubuntu:22.04", "name": "image"}],
            "taskRoles": {
                "taskrole": {
                    "instances": 1,
                    "dockerImage": "image",
                    "commands": ["true"],
                    "resourcePerInstance": {"cpu": 1, "memoryMB": 512, "gpu": 0},
                }
            },
        },
        sort_keys=False,
    )


@pytest.fixture(scope="module")
def pai(tmp_path_factory: pytest.TempPathFactory, certificates: Certificates) -> Iterator[OpenPai]:  # noqa: F811
    """One HTTPS emulator for the client tests (they only read, or submit jobs of their own names)."""
    emulator = start_openpai(tmp_path_factory.mktemp("openpai"), tls=certificates.server)
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
async def clients(pai: OpenPai) -> AsyncIterator[Callable[..., OpenpaiClient]]:
    """``clients(ca_bundle, host=pai.url)``: a real OpenpaiClient for alice; all closed at the end."""
    made: list[OpenpaiClient] = []

    def make(ca_bundle: Path | None, host: str | None = None) -> OpenpaiClient:
        made.append(OpenpaiClient(host or pai.url, "alice", pai.token("alice"), ca_bundle, 10.0, 5.0))
        return made[-1]

    yield make
    await asyncio.gather(*(client.close() for client in made))


def every_call(client: OpenpaiClient, name: str) -> dict[str, Callable[[], Awaitable[object]]]:
    """Each call of the client, on job ``name``."""
    return {
        "check": lambda: client.check(None, "confignfs"),
        "submit": lambda: client.submit(job_yaml(name), name),
        "job": lambda: client.job(name),
        "jobs": lambda: client.jobs(name),
        "stop": lambda: client.stop(name),
    }


async def refusals(client: OpenpaiClient, name: str) -> dict[str, str]:
    """Each call's PermanentError message (a call that does not raise one fails the test)."""
    found = {}
    for call, run in every_call(client, name).items():
        with pytest.raises(PermanentError) as caught:
            await run()
        found[call] = str(caught.value)
    return found


async def test_with_the_clusters_ca_bundle_every_call_works(pai, clients, certificates):  # noqa: F811
    assert pai.url.startswith("https://")
    client = clients(certificates.ca)
    assert await client.check(None, "confignfs") == []
    name = f"tls-{uuid.uuid4().hex[:8]}"
    await client.submit(job_yaml(name), name)
    deadline = time.monotonic() + 15
    while (detail := await client.job(name))["jobStatus"]["state"] != "SUCCEEDED":
        assert time.monotonic() < deadline and detail["jobStatus"]["state"] not in ("FAILED", "STOPPED"), detail
        await asyncio.sleep(0.05)
    assert [(j["name"], j["state"]) for j in await client.jobs(name)] == [(name, "SUCCEEDED")]
    await client.stop(name)  # a finished job: no error
    assert pai.job("alice", name)["jobStatus"]["state"] == "SUCCEEDED", "the emulator's own helpers trust it too"


async def test_with_the_system_cas_every_call_fails_for_good_naming_the_setting(pai, clients):
    name = f"never-{uuid.uuid4().hex[:8]}"
    for call, message in (await refusals(clients(None), name)).items():
        assert message.startswith(f"cannot verify the HTTPS certificate of {pai.url}: "), (call, message)
        assert re.search("self.signed certificate in certificate chain; ", message) and HINT in message, (call, message)
        assert pai.token("alice") not in message
    reply = httpx.get(f"{pai.api}/jobs/alice~{name}", headers=pai.headers("alice"), verify=pai.verify)
    assert reply.status_code == 404, "the job was never submitted"


async def test_another_cas_bundle_fails_the_same_way(pai, clients, tmp_path):
    stranger = make_certificates(tmp_path / "other", name="Some other CA")
    for call, message in (await refusals(clients(stranger.ca), "never")).items():
        assert message.startswith(f"cannot verify the HTTPS certificate of {pai.url}: "), (call, message)
        assert HINT in message, (call, message)


async def test_a_certificate_for_another_name_fails_naming_the_mismatch(clients, tmp_path):
    certs = make_certificates(tmp_path / "tls", hosts=["127.0.0.1"])  # the cluster is addressed as localhost below
    with start_openpai(tmp_path / "pai", tls=certs.server) as other:
        host = other.url.replace("127.0.0.1", "localhost")
        for call, message in (await refusals(clients(certs.ca, host=host), "never")).items():
            assert message.startswith(f"cannot verify the HTTPS certificate of {host}: "), (call, message)
            assert "not valid for 'localhost'" in message and HINT in message, (call, message)


async def test_a_cluster_that_does_not_answer_stays_transient(clients):
    client = clients(None, host=f"https://127.0.0.1:{free_port()}")  # nothing listens there
    for call, run in every_call(client, "never").items():
        with pytest.raises(TransientError, match="cannot reach OpenPAI") as caught:
            await run()
        assert caught.value.delay > 0, call


# -- the whole stack ---------------------------------------------------------------------------


@pytest.fixture
def https_pai(tmp_path: Path, share, certificates: Certificates) -> Iterator[OpenPai]:  # noqa: F811
    local, container = share
    emulator = start_openpai(tmp_path / "pai", mounts={str(container): str(local)}, tls=certificates.server)
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def start_stack(tmp_path: Path, nats_server, https_pai: OpenPai, request) -> Iterator[Callable[..., Stack]]:
    """``start_stack(env, *services)``: the stack with ``env`` added; stopped at the end (logs shown on failure)."""
    started: list[Stack] = []

    def start(env: dict[str, str], *names: str) -> Stack:
        started.append(Stack(root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_STATUS_POLL": "0.3", **env}))
        return started[-1].start(*names)

    yield start
    for stack in started:
        stack.stop()
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            print(stack.logs(), https_pai.log()[-4000:], file=sys.stderr)


@pytest.mark.timeout(240)
def test_a_trial_succeeds_on_an_https_cluster_given_its_ca_bundle(
    start_stack,
    https_pai,
    share,  # noqa: F811 - fixtures
    certificates,  # noqa: F811
    tmp_path,
):
    stack = start_stack({"TRIALBUS_OPENPAI_CA_BUNDLE": str(certificates.ca)}, "dispatcher", "gateway", "openpai")
    experiment = create(stack, openpai_config(write_code(tmp_path, TRIAL), https_pai, share))
    trial_id = submit(stack, experiment, {"x": 7, "intermediate": 1})
    found = ended(stack, trial_id, timeout=120)
    assert found["status"] == "SUCCEEDED" and found["finalMetric"]["default"] == 7, found
    assert found["intermediateCount"] == 1, found
    job = https_pai.job("alice", f"trialbus_{experiment}_{trial_id}")
    assert job["jobStatus"]["state"] == "SUCCEEDED"


@pytest.mark.timeout(240)
def test_without_the_ca_bundle_creation_is_refused_naming_the_setting(start_stack, https_pai, share, tmp_path):  # noqa: F811
    stack = start_stack({}, "dispatcher", "openpai")
    reply = stack.rest("POST", "/experiments", json=openpai_config(write_code(tmp_path, TRIAL), https_pai, share))
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert f"cannot verify the HTTPS certificate of {https_pai.url}" in error and HINT in error, error
