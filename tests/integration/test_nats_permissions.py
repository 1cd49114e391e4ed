"""A NATS user per service (``k8s/base/nats/auth.conf``) on a real nats-server.

The server runs ``deploy/nats/nats.conf``, the one docker compose runs, with only its
addresses moved to random ports and a temporary store, and the real ``auth.conf`` beside it.
The stack runs an experiment with each service under its own user; then each user is shown
what the server refuses it, as nats-py reports it: a ``nats: permissions violation for
publish to "<subject>"`` error (or ``subscription to``) from the server, and nothing done.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, ObjectMeta

from contracts import streams, subjects
from contracts.messages import MetricRecord
from services.common.bus import Bus, bootstrap, inbox_prefix
from services.dispatcher.callout import new_issuer
from tests.e2e.helpers import wait_until
from tests.fixtures.nats import NatsServer, free_port
from tests.fixtures.stack import Stack
from trialbus.client import AsyncClient
from trialbus.watcher import TrialOutcome

ROOT = Path(__file__).resolve().parents[2]
NATS_CONF = ROOT / "deploy" / "nats" / "nats.conf"
AUTH_CONF = ROOT / "k8s" / "base" / "nats" / "auth.conf"
USERS = ("dispatcher", "gateway", "local-gpu", "remote", "openpai", "frameworkcontroller", "tuner", "webui", "client")
#: The user each service of ``Stack`` runs as.
SERVICE_USERS = {
    "dispatcher": "dispatcher",
    "gateway": "gateway",
    "adapter": "local-gpu",
    "remote": "remote",
    "tuner": "tuner",
    "webui": "webui",
}

TRIAL = """
import nni
params = nni.get_next_parameter()
for i in range(2):
    nni.report_intermediate_result(params["x"] + i)
nni.report_final_result(params["x"] * 10)
"""


def password_variable(user: str) -> str:
    """``NATS_PASSWORD_LOCAL_GPU`` for ``local-gpu``: the server reads it from its environment."""
    return "NATS_PASSWORD_" + user.upper().replace("-", "_")


class AuthNatsServer(NatsServer):
    """nats-server on deploy/nats/nats.conf, ports and store moved, auth.conf included from beside it."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        super().__init__(root / "jetstream")
        self.passwords = {user: secrets.token_hex(12) for user in USERS}
        #: The auth callout's issuer: the seed the dispatcher signs with, the public key the server trusts.
        self.callout_seed, self.callout_issuer = new_issuer()
        self.config = root / "nats.conf"
        self.log = root / "nats-server.log"
        text = NATS_CONF.read_text()
        for old, new in (
            ('listen: "0.0.0.0:4222"', f'listen: "127.0.0.1:{self.port}"'),
            ("http_port: 8222", f"http_port: {free_port()}"),
            ('store_dir: "/data"', f'store_dir: "{self.store}"'),
        ):
            assert old in text, f"{NATS_CONF} no longer says {old!r}: update this test"
            text = text.replace(old, new)
        self.config.write_text(text)
        (root / "auth.conf").symlink_to(AUTH_CONF)

    def start(self) -> AuthNatsServer:
        env = {**os.environ, **{password_variable(u): p for u, p in self.passwords.items()}}
        env["NATS_CALLOUT_ISSUER"] = self.callout_issuer
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([self.binary, "-c", str(self.config)], env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited:\n{self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("nats-server did not start")


@pytest.fixture
def server(tmp_path: Path):
    server = AuthNatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


@dataclass
class User:
    """A connection as one user, with the errors the server sent it."""

    nc: Client
    errors: asyncio.Queue[str]

    async def refused(self, action: str, subject: str, call: Awaitable[object] | None = None) -> None:
        """The server refuses this user ``action`` (``publish``, ``subscription``) to ``subject``;
        ``call``, the nats-py call that needs it, is abandoned once it is refused (it would wait
        for its timeout: the server answers a refused request with the error only)."""
        expected = f'permissions violation for {action} to "{subject}"'.lower()  # nats-py lower-cases it
        task = asyncio.ensure_future(call) if call is not None else None
        try:
            async with asyncio.timeout(5):
                while expected not in (await self.errors.get()).lower():
                    pass
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


@pytest.fixture
async def connect(server: AuthNatsServer):
    opened: list[Client] = []

    async def connect(user: str) -> User:
        errors: asyncio.Queue[str] = asyncio.Queue()

        async def on_error(exc: Exception) -> None:
            errors.put_nowait(str(exc))

        # Services take replies on their own inbox prefix (services/common/bus.py); clients on nats-py's.
        prefix = {} if user == "client" else {"inbox_prefix": inbox_prefix(user)}
        nc = await nats.connect(
            server.url, user=user, password=server.passwords[user], error_cb=on_error, allow_reconnect=False, **prefix
        )
        opened.append(nc)
        return User(nc, errors)

    yield connect
    for nc in opened:
        await nc.close()


@pytest.fixture
async def dispatcher(connect) -> User:
    """The dispatcher's user, with the streams and buckets it creates."""
    user = await connect("dispatcher")
    await bootstrap(user.nc.jetstream())
    return user


async def stored(dispatcher: User, subject: str) -> int:
    info = await dispatcher.nc.jetstream().stream_info(streams.DISPATCH.name, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def await_until_async(get, status: str, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while (await get()).status.value != status:
            await asyncio.sleep(0.1)


# -- the stack, a user per service -------------------------------------------------------------


def test_an_experiment_runs_with_a_nats_user_per_service(server: AuthNatsServer, tmp_path: Path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    stack = Stack(
        root=tmp_path,
        nats=server,
        service_env={
            name: {"TRIALBUS_NATS_USER": user, "TRIALBUS_NATS_PASSWORD": server.passwords[user]}
            for name, user in SERVICE_USERS.items()
        },
    )
    try:
        # Given the gateway and two adapters, which may not create streams, started first
        with ThreadPoolExecutor(1) as pool:
            early = pool.submit(stack.start, "gateway", "adapter", "remote", "tuner", "webui")
            wait_until(
                lambda: "waiting for the dispatcher to create stream DISPATCH" in stack.log("adapter"),
                15,
                "the adapter to wait for the dispatcher",
            )
            wait_until(
                lambda: "waiting for the dispatcher to create stream METRICS" in stack.log("gateway"),
                15,
                "the gateway to wait for the dispatcher",
            )
            # when the dispatcher comes up, they start
            stack.start("dispatcher")
            early.result(timeout=30)

            # and a tuner runs three trials as the client user
            async def tune() -> tuple[list[TrialOutcome], list[MetricRecord], list[str], str]:
                async with AsyncClient(server.url, user="client", password=server.passwords["client"]) as client:
                    experiment = await client.create_experiment(
                        {
                            "experimentName": "permissions",
                            "trialCommand": f"{sys.executable} trial.py",
                            "trialCodeDirectory": str(code),
                            "trialConcurrency": 2,
                            "trainingService": {"platform": "local"},
                        }
                    )
                    trials = [await client.submit_trial(experiment, {"x": x}) for x in range(3)]
                    outcomes = [await client.wait_trial(t.id, timeout=30) for t in trials]
                    # and the tuner service drives one: a grid of two points, judged by an assessor
                    tuned = await client.create_experiment(
                        {
                            "trialCommand": f"{sys.executable} trial.py",
                            "trialCodeDirectory": str(code),
                            "trialConcurrency": 2,
                            "trainingService": {"platform": "local"},
                            "searchSpace": {"x": {"_type": "choice", "_value": [5, 6]}},
                            "tuner": {"name": "GridSearch"},
                            "assessor": {"name": "Medianstop"},
                        }
                    )
                    await await_until_async(lambda: client.get_experiment(tuned), "DONE")
                    tuned_trials = await client.list_trials(tuned)
                    finals = sorted(t.final_metric for t in tuned_trials)
                    assert finals == [50, 60], finals
                    records = []
                    async with asyncio.timeout(10), contextlib.aclosing(client.metrics(experiment)) as metrics:
                        async for record in metrics:
                            records.append(record)
                            if len(records) == 9:
                                break
                    return outcomes, records, [t.id for t in trials], tuned_trials[0].id

            outcomes, records, trial_ids, done_trial = asyncio.run(tune())
            # and the web UI shows them, with curves from METRICS, and relays actions to the dispatcher
            shown = httpx.get(f"{stack.webui}/api/experiments", headers=stack.auth, timeout=10).json()
            assert len(shown) == 2, shown
            curve = httpx.get(f"{stack.webui}/api/trials/{trial_ids[0]}/metrics", headers=stack.auth, timeout=10)
            assert curve.status_code == 200 and len(curve.json()) == 3, curve.text
            again = httpx.post(f"{stack.webui}/api/trials/{trial_ids[0]}/cancel", headers=stack.auth, timeout=10)
            assert again.status_code == 409 and "already ended" in again.json()["error"], again.text
            # (a retry of a DONE experiment's trial: the dispatcher's refusal, so the web UI's user may ask)
            retry = httpx.post(f"{stack.webui}/api/trials/{done_trial}/retry", headers=stack.auth, timeout=10)
            assert retry.status_code == 409 and "is DONE" in retry.json()["error"], retry.text
            # (the queue and the teams' shares, the dispatcher's answers too)
            for path in ("/api/queue", "/api/teams"):
                read = httpx.get(f"{stack.webui}{path}", headers=stack.auth, timeout=10)
                assert read.status_code == 200 and isinstance(read.json(), list), read.text
            # (the experiment's own logs: the dispatcher's and the tuner's lines, each published under its user)
            tuned = httpx.get(f"{stack.webui}/api/trials/{done_trial}", headers=stack.auth, timeout=10).json()
            logs = httpx.get(f"{stack.webui}/api/experiments/{tuned['experimentId']}/logs", headers=stack.auth)
            assert logs.status_code == 200, logs.text
            assert {line["service"] for line in logs.json()["lines"]} == {"dispatcher", "tuner"}, logs.text
            # (a DONE experiment's limits, resume and delete: the dispatcher's answers, relayed under the web UI's user)
            done = tuned["experimentId"]
            edit = httpx.patch(
                f"{stack.webui}/api/experiments/{done}", json={"trialConcurrency": 3}, headers=stack.auth, timeout=10
            )
            assert edit.status_code == 409, edit.text
            resume = httpx.post(f"{stack.webui}/api/experiments/{done}/resume", headers=stack.auth, timeout=10)
            assert resume.status_code == 409 and "DONE" in resume.text, resume.text
            gone = httpx.post(f"{stack.webui}/api/experiments/{done}/delete", headers=stack.auth, timeout=10)
            assert gone.status_code == 200, gone.text
    except BaseException:
        print(stack.logs(), file=sys.stderr)
        raise
    finally:
        stack.stop()
    # then every trial succeeded with its metrics, and no service was refused anything it does
    assert [(o.status.value, o.final) for o in outcomes] == [("SUCCEEDED", 0), ("SUCCEEDED", 10), ("SUCCEEDED", 20)]
    assert sorted((r.type.value, r.decoded()) for r in records) == sorted(
        [("FINAL", x * 10) for x in range(3)] + [("PERIODICAL", x + i) for x in range(3) for i in range(2)]
    )
    for name in SERVICE_USERS:
        assert "NATS refused" not in stack.log(name), stack.log(name)


# -- what each user may not do -----------------------------------------------------------------


async def test_an_experiment_s_log_lines_are_published_by_their_service_and_read_by_the_web_ui_alone(
    connect, dispatcher: User
):
    # Given a line of the tuner's about experiment e1
    tuner = await connect("tuner")
    await tuner.nc.publish("logs.e1.tuner", b'{"message": "driving experiment e1"}')
    await tuner.nc.flush()
    # the tuner may not speak as the dispatcher
    await tuner.nc.publish("logs.e1.dispatcher", b"{}")
    await tuner.refused("publish", "logs.e1.dispatcher")
    # the web UI reads it
    webui = await connect("webui")
    sub = await webui.nc.jetstream().subscribe("logs.e1.*", stream=streams.LOGS.name, ordered_consumer=True)
    assert (await sub.next_msg(timeout=5)).data == b'{"message": "driving experiment e1"}'
    # a client (and a trial, which has no NATS user: it reports to the gateway over HTTP) may not
    client = await connect("client")
    reading = asyncio.ensure_future(
        client.nc.jetstream().subscribe("logs.e1.*", stream=streams.LOGS.name, ordered_consumer=True)
    )
    try:
        async with asyncio.timeout(5):
            while (
                'permissions violation for publish to "$js.api.consumer.create.logs'
                not in (await client.errors.get()).lower()
            ):
                pass
    finally:
        reading.cancel()
        with contextlib.suppress(BaseException):
            await reading


async def test_an_adapter_reads_only_its_own_dispatch_subject(connect, dispatcher: User):
    # Given a request for the remote adapter waiting on its consumer
    remote = await connect("remote")
    await remote.nc.jetstream().add_consumer(streams.DISPATCH.name, streams.adapter_consumer("remote"))
    await dispatcher.nc.jetstream().publish("dispatch.remote", b'{"secret": "ssh password"}')
    local = await connect("local-gpu")
    js = local.nc.jetstream()
    # the local-gpu user has its own consumer
    await js.add_consumer(streams.DISPATCH.name, streams.adapter_consumer("local-gpu"))

    # When it fetches from remote's consumer, the server refuses
    pull = await js.pull_subscribe_bind("adapter-remote", stream=streams.DISPATCH.name)
    await local.refused("publish", "$JS.API.CONSUMER.MSG.NEXT.DISPATCH.adapter-remote", pull.fetch(1, timeout=5))
    # nor may it make a consumer of its own on dispatch.remote, under its name or another
    sneaky = ConsumerConfig(
        name="adapter-local-gpu", durable_name="adapter-local-gpu", filter_subject="dispatch.remote"
    )
    await local.refused(
        "publish",
        "$JS.API.CONSUMER.CREATE.DISPATCH.adapter-local-gpu.dispatch.remote",
        js.add_consumer(streams.DISPATCH.name, sneaky),
    )
    await local.refused(
        "publish",
        "$JS.API.CONSUMER.DURABLE.CREATE.DISPATCH.sneaky",
        js.add_consumer(streams.DISPATCH.name, durable_name="sneaky", filter_subject="dispatch.remote"),
    )
    # and on the subject it may use, the server checks the filter in the body against it
    own = "$JS.API.CONSUMER.CREATE.DISPATCH.adapter-local-gpu.dispatch.local-gpu"
    body = {"stream_name": "DISPATCH", "config": {**sneaky.as_dict(), "ack_policy": "explicit"}}
    reply = json.loads((await local.nc.request(own, json.dumps(body).encode(), timeout=5)).data)
    assert reply["error"]["err_code"] == 10131, reply  # "did not match filtered subject from create subject"

    # Nor may it subscribe to dispatch.>, or read another service's replies
    sub = await local.nc.subscribe("dispatch.>")
    await local.refused("subscription", "dispatch.>")
    for inbox in ("_INBOX_remote.>", "_INBOX.>"):
        await local.nc.subscribe(inbox)
        await local.refused("subscription", inbox)
    await dispatcher.nc.jetstream().publish("dispatch.remote", b"{}")
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.3)

    # nor publish a request
    await local.nc.publish("dispatch.x", b"{}")
    await local.refused("publish", "dispatch.x")
    # Then the requests for remote are still there, for remote only
    assert await stored(dispatcher, "dispatch.x") == 0
    assert await stored(dispatcher, "dispatch.remote") == 2
    fetched = await (await remote.nc.jetstream().pull_subscribe_bind("adapter-remote", stream="DISPATCH")).fetch(2)
    assert [m.data for m in fetched] == [b'{"secret": "ssh password"}', b"{}"]


async def test_an_adapter_publishes_events_only_under_its_own_name(connect, dispatcher: User):
    # Given the local-gpu adapter's user, which may report its own trials
    local = await connect("local-gpu")
    ack = await local.nc.jetstream().publish(subjects.events("x", "y", "local-gpu"), b"{}")
    assert ack.stream == streams.EVENTS.name

    # When it speaks as another adapter, as the dispatcher, or without a source (the older layout)
    for subject in (subjects.events("x", "y", "openpai"), subjects.events("x", "y", subjects.DISPATCHER), "events.x.y"):
        await local.nc.publish(subject, b"{}")
        # then the server refuses it
        await local.refused("publish", subject)
    # and the dispatcher speaks only as itself
    await dispatcher.nc.jetstream().publish(subjects.events("x", "y", subjects.DISPATCHER), b"{}")
    await dispatcher.nc.publish(subjects.events("x", "y", "openpai"), b"{}")
    await dispatcher.refused("publish", subjects.events("x", "y", "openpai"))
    info = await dispatcher.nc.jetstream().stream_info(streams.EVENTS.name, subjects_filter=">")
    assert info.state.subjects == {"events.x.y.local-gpu": 1, "events.x.y.dispatcher": 1}


async def test_the_gateway_publishes_metrics_only(connect, dispatcher: User):
    gateway = await connect("gateway")
    ack = await gateway.nc.jetstream().publish("metrics.e1.t1", b"{}")
    assert ack.stream == streams.METRICS.name
    for subject in ("events.x.y.local-gpu", "dispatch.local-gpu"):
        await gateway.nc.publish(subject, b"{}")
        await gateway.refused("publish", subject)
    assert await stored(dispatcher, "dispatch.local-gpu") == 0
    assert (await dispatcher.nc.jetstream().stream_info(streams.EVENTS.name)).state.messages == 0


async def test_a_client_asks_the_dispatcher_and_publishes_no_work_events_or_metrics(connect, dispatcher: User):
    client = await connect("client")
    for subject in ("dispatch.local-gpu", "events.x.y.local-gpu", "metrics.x.y"):
        await client.nc.publish(subject, b"{}")
        await client.refused("publish", subject)
    await client.nc.jetstream().stream_info(streams.EVENTS.name)  # it may read events and metrics
    await client.refused("publish", "$JS.API.STREAM.CREATE.SNEAKY", client.nc.jetstream().add_stream(name="SNEAKY"))
    js = dispatcher.nc.jetstream()
    assert await stored(dispatcher, "dispatch.local-gpu") == 0
    assert [(await js.stream_info(s)).state.messages for s in ("EVENTS", "METRICS")] == [0, 0]


async def test_the_remote_adapter_alone_keeps_checkpoint_copies(connect, dispatcher: User):
    # Given the checkpoints store the dispatcher made (copies expire after 7 days without a write)
    info = await dispatcher.nc.jetstream().stream_info(f"OBJ_{streams.CHECKPOINT_STORE.bucket}")
    assert info.config.max_age == 7 * 86400
    # the remote adapter saves a trial's copy as services/adapters/remote/checkpoints.py does, then
    # saves it again (the first one's chunks purged), reads it back for a retry, and deletes it
    remote = await connect("remote")
    store = await Bus(remote.nc, remote.nc.jetstream()).checkpoint_store()
    headers = {"Trialbus-Attempt": ["0"]}
    await store.put("e1/t1", io.BytesIO(secrets.token_bytes(300_000)), meta=ObjectMeta(name="e1/t1", headers=headers))
    await store.put("e1/t1", io.BytesIO(b"step 2"), meta=ObjectMeta(name="e1/t1", headers=headers))
    assert (await store.get_info("e1/t1")).headers == headers
    copy = io.BytesIO()
    await store.get("e1/t1", writeinto=copy)
    assert copy.getvalue() == b"step 2"
    await store.delete("e1/t1")
    assert (await store.status()).stream_info.state.bytes < 1000, "no chunk is left behind"
    # When another adapter or a client looks at the copies, or the remote adapter writes code
    local, client = await connect("local-gpu"), await connect("client")
    await local.refused(
        "publish",
        "$JS.API.STREAM.INFO.OBJ_checkpoints",
        local.nc.jetstream().object_store(streams.CHECKPOINT_STORE.bucket),
    )
    await client.nc.publish("$O.checkpoints.M.x", b"{}")
    await client.refused("publish", "$O.checkpoints.M.x")
    await remote.nc.publish("$O.code.M.x", b"{}")
    # then the server refuses
    await remote.refused("publish", "$O.code.M.x")


async def test_the_dispatcher_keeps_imported_results_and_the_tuner_reads_them(connect, dispatcher: User):
    # Given results imported into an experiment, as the dispatcher keeps them (services/dispatcher/imports.py)
    rows = b'[{"parameter": {"x": 0.9}, "value": 1.0}]'
    await (await dispatcher.nc.jetstream().key_value(streams.IMPORTS_BUCKET.bucket)).put("e1", rows)
    # When the tuner service reads them as a driver does (services/tuner/imports.py)
    tuner = await connect("tuner")
    kv = await Bus(tuner.nc, tuner.nc.jetstream()).kv(streams.IMPORTS_BUCKET.bucket)
    # then it may, and may not write them
    assert (await kv.get("e1")).value == rows
    await tuner.nc.publish("$KV.imports.e1", b"[]")
    await tuner.refused("publish", "$KV.imports.e1")


async def test_a_wrong_password_or_none_is_refused(server: AuthNatsServer):
    # (a connection that is no service's goes to the auth callout, and here no dispatcher answers it:
    # the server refuses it once its callout times out, which may take longer than nats-py's default
    # connect timeout of 2 s)
    for credentials in ({"user": "client", "password": "wrong"}, {"user": "dispatcher", "password": "x"}, {}):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(server.url, allow_reconnect=False, error_cb=ignore, connect_timeout=15, **credentials)
    # nats-py (2.16) leaves the refused connection's socket open: collect it here, quietly, not
    # in a later test (where its ResourceWarning would be an error).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


async def ignore(exc: Exception) -> None:
    """nats-py's default error callback logs the refusal with a traceback; the test asserts on it."""


async def test_the_gateway_relays_a_trials_ask_and_a_client_answers_it(connect, dispatcher: User):
    # Given a client answering an experiment's questions, as trialbus.optuna.optimize does
    client = await connect("client")

    async def answer(msg) -> None:
        await msg.respond(b'{"kind": "trial.answer", "v": 1, "ok": true, "value": 0.5}')

    await client.nc.subscribe(subjects.asks("ann", "e1", "*"), cb=answer)
    await client.nc.flush()
    # When the gateway relays a trial's ask (services/metrics_gateway/asks.py)
    gateway = await connect("gateway")
    reply = await gateway.nc.request(subjects.asks("ann", "e1", "t1"), b"{}", timeout=5)
    # then the client's answer comes back on the gateway's inbox
    assert json.loads(reply.data)["value"] == 0.5
    # and no client may ask in a trial's name, nor may another service listen to the asks
    await client.nc.publish(subjects.asks("ann", "e1", "t1"), b"{}")
    await client.refused("publish", subjects.asks("ann", "e1", "t1"))
    for user in ("local-gpu", "webui", "tuner"):
        other = await connect(user)
        await other.nc.subscribe(subjects.asks())
        await other.refused("subscription", subjects.asks())
