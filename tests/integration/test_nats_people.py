"""People on NATS, each with their own token (docs/security.md, "People").

A real nats-server runs ``deploy/nats/nats.conf`` with the real ``auth.conf``
(:class:`AuthNatsServer`); the dispatcher runs as its NATS user and answers the server's auth
callout (services/dispatcher/callout.py). A person connects with nothing but their Trialbus
token, calls the API as themselves, reads the streams, and is refused everything else; a wrong,
replaced or removed token is refused at connect; the services' users are not asked about.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import nats
import orjson
import pytest

from contracts import subjects
from contracts.people import token_key, token_name
from tests.fixtures.stack import Stack
from tests.integration.test_nats_permissions import AuthNatsServer, User
from trialbus.api import TrialbusError
from trialbus.client import AsyncClient

TRIALBUS = str(Path(sys.executable).parent / "trialbus")
TRIAL = "import nni\nnni.report_final_result(1)\n"


@pytest.fixture
def stack(tmp_path: Path):
    server = AuthNatsServer(tmp_path / "nats").start()
    dispatcher = {
        "TRIALBUS_NATS_USER": "dispatcher",
        "TRIALBUS_NATS_PASSWORD": server.passwords["dispatcher"],
        "TRIALBUS_NATS_CALLOUT_SEED": server.callout_seed,
    }
    stack = Stack(root=tmp_path, nats=server, service_env={"dispatcher": dispatcher})
    try:
        yield stack.start("dispatcher")
    finally:
        stack.stop()
        server.stop()


def add(stack: Stack, name: str, team: str) -> str:
    answer = stack.rest("POST", "/users", json={"name": name, "team": team, "role": "member"})
    assert answer.status_code == 201, answer.text
    token = answer.json()["token"]
    assert token_name(token) == name  # tbu_<name>.<secret>: the client knows who it connects as
    return token


def experiment(code: Path) -> dict:
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 1,
        "trainingService": {"platform": "local"},
    }


async def person(stack: Stack, token: str) -> User:
    """A raw connection with a person's token, on their inbox, with the errors the server sends it."""
    errors: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        errors.put_nowait(str(exc))

    name = token_name(token)
    assert name is not None
    nc = await nats.connect(
        stack.nats.url,
        token=token,
        inbox_prefix=subjects.person_inbox(name),
        error_cb=on_error,
        allow_reconnect=False,
    )
    return User(nc, errors)


def door(token: str, operation: str = "whoami") -> str:
    """The API door of the person ``token`` names, as their connection may use it."""
    name = token_name(token)
    assert name is not None
    return subjects.api_as(name, token_key(token), operation)


async def ask(user: User, subject: str) -> dict:
    return orjson.loads((await user.nc.request(subject, b"{}", timeout=5)).data)


async def refused_at_connect(stack: Stack, **credentials: str) -> str:
    with pytest.raises(nats.errors.Error) as refused:
        await nats.connect(stack.nats.url, allow_reconnect=False, max_reconnect_attempts=0, **credentials)
    return str(refused.value)


async def test_a_person_connects_with_their_token_and_acts_as_themselves(stack: Stack, tmp_path: Path):
    ana, bo = add(stack, "ana", "vision"), add(stack, "bo", "nlp")
    # Bo, with nothing but his token, uploads his code and creates an experiment, submits a trial
    async with AsyncClient(stack.nats.url, token=bo) as client:
        assert client.person == "bo"
        assert await client.whoami() == {"name": "bo", "team": "nlp", "role": "member"}
        made = await client.create_experiment(experiment(tmp_path / "code"))
        trial = await client.submit_trial(made, {"x": 1})
        # and reads its events from the stream (an ordered consumer, delivered on his inbox)
        async with asyncio.timeout(10), contextlib.aclosing(client.events(made)) as events:
            first = await anext(events)
        assert first.trial_id == trial.id
    # Ana is herself, and may not stop another team's experiment
    async with AsyncClient(stack.nats.url, token=ana) as client:
        assert (await client.whoami())["name"] == "ana"
        with pytest.raises(TrialbusError) as refused:
            await client.stop_experiment(made)
        assert refused.value.status == 403 and "belongs to team nlp" in str(refused.value)
    # The audit trail names each
    trail = stack.rest("GET", "/audit").json()
    assert [(r["user"], r["action"], r["status"]) for r in trail if r["action"].startswith("experiment.")] == [
        ("bo", "experiment.create", 200),
        ("ana", "experiment.stop", 403),
    ]


async def test_a_person_may_use_only_their_own_door_and_inbox(stack: Stack):
    ana, bo = add(stack, "ana", "vision"), add(stack, "bo", "nlp")
    user = await person(stack, ana)
    try:
        # the services' door: a header-less call there is the stack's admin
        await user.refused("publish", subjects.api("whoami"), user.nc.request(subjects.api("whoami"), b"", timeout=5))
        # another person's door and inbox
        await user.refused("publish", door(bo), user.nc.publish(door(bo)))
        await user.refused("subscription", "_INBOX_as.bo.>", user.nc.subscribe("_INBOX_as.bo.>"))
        # a service's inbox, the streams' subjects, the state buckets
        await user.refused("subscription", "_INBOX_dispatcher.>", user.nc.subscribe("_INBOX_dispatcher.>"))
        await user.refused("subscription", "events.>", user.nc.subscribe("events.>"))
        await user.refused("publish", "$KV.users.ana", user.nc.publish("$KV.users.ana", b"{}"))
        # the services' log lines about experiments (the web UI's Logs view reads them for her), nor write one
        info = "$JS.API.STREAM.INFO.LOGS"
        await user.refused("publish", info, user.nc.request(info, b"", timeout=5))
        await user.refused("publish", "logs.e1.dispatcher", user.nc.publish("logs.e1.dispatcher", b"{}"))
        # while her own door answers
        assert (await ask(user, door(ana)))["result"]["name"] == "ana"
    finally:
        await user.nc.close()


async def test_a_wrong_replaced_or_removed_token_is_refused_at_connect(stack: Stack):
    ana, bo = add(stack, "ana", "vision"), add(stack, "bo", "nlp")
    assert "authorization violation" in (await refused_at_connect(stack, token="tbu_ana.wrong")).lower()
    assert "authorization violation" in (await refused_at_connect(stack, token=stack.token)).lower()  # no person's
    assert "authorization violation" in (await refused_at_connect(stack)).lower()  # no credential at all
    assert "authorization violation" in (await refused_at_connect(stack, user="ana", password=bo)).lower()
    # a replaced token: refused at connect, and a connection opened with it may no longer call the API
    before = await person(stack, ana)
    try:
        assert stack.rest("POST", "/users/ana/token").status_code == 200
        assert "authorization violation" in (await refused_at_connect(stack, token=ana)).lower()
        reply = await ask(before, door(ana))
        assert reply["status"] == 401 and "ana has a new token since this connection" in reply["error"]
    finally:
        await before.nc.close()
    # a removed user: refused at connect, and a connection opened before may no longer call the API
    still = await person(stack, bo)
    try:
        assert stack.rest("DELETE", "/users/bo").status_code == 200
        assert "authorization violation" in (await refused_at_connect(stack, token=bo)).lower()
        reply = await ask(still, door(bo))
        assert reply["status"] == 401 and "bo was removed" in reply["error"]
    finally:
        await still.nc.close()
    # the client says what to do
    with pytest.raises(TrialbusError) as refused:
        await AsyncClient(stack.nats.url, token=bo).connect()
    assert "refused your user's token (TRIALBUS_API_TOKEN)" in str(refused.value)
    # and the server's log never holds a token
    log = stack.nats.log.read_text()
    assert "Authorization Violation" in log or "authentication error" in log
    assert all(token not in log for token in (ana, bo, stack.token))


async def test_the_services_users_are_not_asked_about(stack: Stack):
    server: AuthNatsServer = stack.nats  # type: ignore[assignment]
    nc = await nats.connect(server.url, user="client", password=server.passwords["client"], allow_reconnect=False)
    try:  # the client user: the stack's admin, as before
        reply = orjson.loads((await nc.request(subjects.api("whoami"), b"{}", timeout=5)).data)
        assert reply["result"]["name"] == "admin"
    finally:
        await nc.close()


def test_the_cli_as_a_person_needs_only_their_token_and_the_nats_url(stack: Stack, tmp_path: Path):
    ana = add(stack, "ana", "vision")
    nowhere = tmp_path / "no-data-dir"  # no client.json to find
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIALBUS_", "NATS_"))}
    env |= {"TRIALBUS_NATS_URL": stack.nats.url, "TRIALBUS_API_TOKEN": ana, "TRIALBUS_DATA_DIR": str(nowhere)}
    me = subprocess.run([TRIALBUS, "whoami"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert me.returncode == 0 and me.stdout.strip() == "ana (team vision, member)", me
    env["TRIALBUS_API_TOKEN"] = "tbu_ana.not-her-token"
    wrong = subprocess.run([TRIALBUS, "whoami"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert wrong.returncode == 1 and "refused your user's token" in wrong.stderr + wrong.stdout, wrong


async def test_a_person_answers_only_her_own_experiments_trials_questions(stack: Stack):
    ana, bo = add(stack, "ana", "vision"), add(stack, "bo", "nlp")
    user = await person(stack, ana)
    gateway = await nats.connect(
        stack.nats.url,
        user="gateway",
        password=stack.nats.passwords["gateway"],
        inbox_prefix="_INBOX_gateway",
        allow_reconnect=False,
    )
    try:
        # Ana answers her trials' questions, as trialbus.optuna.optimize does, one answer each
        async def answer(msg) -> None:
            await msg.respond(b'{"kind": "trial.answer", "v": 1, "ok": true, "value": 3}')

        await user.nc.subscribe(subjects.asks("ana", "e1", "*"), cb=answer)
        await user.nc.flush()
        reply = await gateway.request(subjects.asks("ana", "e1", "t1"), b"{}", timeout=5)
        assert orjson.loads(reply.data)["value"] == 3
        # but may not listen to Bo's, nor ask in a trial's name
        bos = subjects.asks("bo", "*", "*")
        await user.refused("subscription", bos, user.nc.subscribe(bos))
        await user.refused("publish", "asks.ana.e1.t1", user.nc.publish("asks.ana.e1.t1", b"{}"))
        assert token_name(bo) == "bo"
    finally:
        await gateway.close()
        await user.nc.close()
