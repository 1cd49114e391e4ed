"""Platform secrets are never on the bus in clear, end to end.

The whole stack runs with ``TRIALBUS_SECRETS_KEY`` on the dispatcher and the adapters (the
stack fixture gives them one). Experiments carry an OpenPAI token and remote machines' SSH
password, private key and passphrase; a trial of each runs through the real remote adapter
(real sshd) and the real openpai adapter (the emulator), so the adapters really unseal and
use each secret. Then every message the bus carried is searched for them, byte for byte:
every stream as JetStream keeps it (``$JS.API.STREAM.NAMES``, then every message of each,
KV and object-store streams included, read raw), and every message published meanwhile (a
core subscription to ``>``: a dispatch request leaves its work queue once acked). The
trials' metrics tokens are searched for too. A dispatcher without a key refuses such an
experiment, and an adapter without the dispatcher's key fails the trial, each saying why.
"""

from __future__ import annotations

import asyncio
import base64
import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from contracts.sealing import generate_key
from services.common.tokens import trial_token
from tests.e2e.conftest import write_code
from tests.e2e.helpers import create, ended, submit
from tests.e2e.test_remote import machine, remote_config, remote_root  # noqa: F401 - fixtures
from tests.fixtures.openpai import openpai_config
from tests.fixtures.sshd import known_hosts_file, make_key, require_password_user, require_sshd
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.timeout(240)

TRIAL = textwrap.dedent(
    """
    import nni

    nni.report_final_result(nni.get_next_parameter()["x"])
    """
)
PASSPHRASE = "passphrase-9d4b21"
#: What the dispatcher answers when it has no key and the config holds a secret.
NO_KEY = (
    "this service has no TRIALBUS_SECRETS_KEY: platform secrets cannot be written to the bus in clear; "
    "set the same key on the dispatcher and the adapters"
)


class Tap:
    """Every message published on the bus while it runs, as (subject, headers + data)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.messages: list[tuple[str, bytes]] = []
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._listen(),), daemon=True)

    async def _listen(self) -> None:
        nc = await nats.connect(self.url)

        async def take(msg) -> None:
            headers = json.dumps(msg.headers or {}).encode()
            self.messages.append((msg.subject, headers + b"\n" + (msg.data or b"")))

        await nc.subscribe(">", cb=take)
        await nc.flush()
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        await nc.flush()
        await nc.close()

    def __enter__(self) -> Tap:
        self._thread.start()
        assert self._ready.wait(10), "the tap did not subscribe"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


async def _every_stored_message(url: str) -> dict[str, list[bytes]]:
    """Every message of every stream, read raw through the JetStream API, by stream."""
    nc = await nats.connect(url)
    found: dict[str, list[bytes]] = {}

    async def api(subject: str, body: dict) -> dict:
        return json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=5)).data)

    try:
        names: list[str] = []
        while True:
            reply = await api("$JS.API.STREAM.NAMES", {"offset": len(names)})
            names += reply.get("streams") or []
            if not reply.get("streams") or len(names) >= reply["total"]:
                break
        for name in names:
            state = (await api(f"$JS.API.STREAM.INFO.{name}", {}))["state"]
            found[name] = []
            for seq in range(state["first_seq"], state["last_seq"] + 1) if state["messages"] else ():
                reply = await api(f"$JS.API.STREAM.MSG.GET.{name}", {"seq": seq})
                if "message" not in reply:  # deleted (acked off a work queue, an old KV revision purged)
                    continue
                message = reply["message"]
                headers, data = (base64.b64decode(message.get(part) or "") for part in ("hdrs", "data"))
                found[name].append(message["subject"].encode() + b" " + headers + b"\n" + data)
    finally:
        await nc.close()
    return found


def every_stored_message(url: str) -> dict[str, list[bytes]]:
    return asyncio.run(_every_stored_message(url))


def holding(secrets: dict[str, str], messages: Iterator[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """(what, where) for each secret found in a message."""
    return [(what, where) for where, raw in messages for what, secret in secrets.items() if secret.encode() in raw]


def test_secrets_are_used_by_the_adapters_and_never_on_the_bus_in_clear(
    tmp_path: Path,
    nats_server,
    sshd_pair,
    remote_root,  # noqa: F811 - fixtures
    pai,  # noqa: F811
    share,  # noqa: F811
    stacks,  # noqa: F811
):
    # Given the stack with the remote and openpai adapters, and machines that take a password
    # and a passphrase-protected key
    require_sshd()
    user = require_password_user()
    key = make_key(tmp_path / "keys", "locked", passphrase=PASSPHRASE)
    sshd_pair[1].authorize(key)
    known = known_hosts_file(tmp_path / "known_hosts", *sshd_pair)
    stack = Stack(
        root=tmp_path,
        nats=nats_server,
        extra_env={
            "TRIALBUS_SSH_KNOWN_HOSTS": str(known),
            "TRIALBUS_REMOTE_ROOT": remote_root,
            "TRIALBUS_STATUS_POLL": "0.3",
        },
    )
    stacks.append(stack.start("dispatcher", "gateway", "remote", "openpai"))
    code = write_code(tmp_path, TRIAL)
    private_key = key.private.read_text()
    secrets = {"ssh password": user.password, "ssh passphrase": PASSPHRASE, "openpai token": pai.token("alice")}
    secrets |= {f"ssh key line {i}": line for i, line in enumerate(private_key.splitlines()) if len(line) >= 16}
    assert len(secrets) > 4, "the key's lines are searched for"

    with Tap(nats_server.url) as tap:
        # When experiments holding each secret run a trial each
        experiments = {
            "password": create(stack, remote_config(code, [machine(sshd_pair[0], password=user.password)])),
            "key": create(
                stack, remote_config(code, [machine(sshd_pair[1], sshKey=private_key, sshPassphrase=PASSPHRASE)])
            ),
            "openpai": create(stack, openpai_config(code, pai, share)),
        }
        trials = {what: submit(stack, experiment, {"x": i}) for i, (what, experiment) in enumerate(experiments.items())}
        finals = {what: ended(stack, trial_id, timeout=120) for what, trial_id in trials.items()}

    # Then the adapters read them: every trial succeeded where its secret let it in
    assert {what: t["status"] for what, t in finals.items()} == dict.fromkeys(trials, "SUCCEEDED"), finals
    assert [finals[what]["finalMetric"] for what in trials] == [0, 1, 2]
    tokens = {f"metrics token of {t}": trial_token(stack.secret, experiments[what], t) for what, t in trials.items()}

    # ... and no message the bus carried, nor any it keeps, holds one in clear
    passed = tap.messages
    dispatched = [raw for subject, raw in passed if subject.startswith("dispatch.")]
    assert len(dispatched) >= 3 and all(b"sealed:v1:" in raw for raw in dispatched), "the tap saw the requests"
    assert holding(secrets | tokens, iter(passed)) == []
    stored = every_stored_message(nats_server.url)
    assert {"KV_experiments", "KV_trials", "EVENTS", "METRICS", "DISPATCH"} <= set(stored), sorted(stored)
    kept = [(name, raw) for name, messages in stored.items() for raw in messages]
    assert all(any(e.encode() in raw for _, raw in kept) for e in experiments.values()), "the dump saw them"
    assert holding(secrets | tokens, iter(kept)) == []
    experiments_kept = b"".join(stored["KV_experiments"])
    assert experiments_kept.count(b"sealed:v1:") >= 4, "the stored configs hold the secrets sealed"


def test_a_dispatcher_without_a_key_refuses_secrets_and_stores_nothing(tmp_path: Path, nats_server, stacks):
    # Given a dispatcher without TRIALBUS_SECRETS_KEY
    stack = Stack(root=tmp_path, nats=nats_server, service_env={"dispatcher": {"TRIALBUS_SECRETS_KEY": ""}})
    stacks.append(stack.start("dispatcher"))
    code = write_code(tmp_path, TRIAL)
    password = "never-stored-2b7e"

    # When an experiment with a machine's password is created
    reply = stack.rest(
        "POST", "/experiments", json=remote_config(code, [{"host": "10.1.2.3", "user": "u", "password": password}])
    )

    # Then it is refused, saying what to set, and nothing is stored
    assert reply.status_code == 422, reply.text
    assert NO_KEY in reply.json()["error"] and "trainingService.machineList.0.password" in reply.json()["error"]
    assert password not in reply.text and password not in stack.log("dispatcher")
    assert stack.rest("GET", "/experiments").json() == []
    assert every_stored_message(nats_server.url).get("KV_experiments", []) == []
    assert "no TRIALBUS_SECRETS_KEY" in stack.log("dispatcher"), "the dispatcher said so at start"
    # ... while an experiment without secrets runs as before
    assert create(stack, remote_config(code, [{"host": "10.1.2.3", "user": "u"}]))


@pytest.mark.parametrize("key", ["", "another"], ids=["no-key", "another-key"])
def test_an_adapter_without_the_dispatchers_key_fails_the_trial_saying_which_key(
    tmp_path: Path, nats_server, stacks, key: str
):
    # Given a dispatcher with a key, and an experiment created while no remote adapter runs
    stack = Stack(root=tmp_path, nats=nats_server)
    stack.service_env["remote"] = {"TRIALBUS_SECRETS_KEY": generate_key() if key else ""}
    stacks.append(stack.start("dispatcher", "gateway"))
    code = write_code(tmp_path, TRIAL)
    password = "never-shown-c41a"
    config = remote_config(code, [{"host": "127.0.0.1", "port": 9, "user": "u", "password": password}])
    experiment = create(stack, config)

    # When a remote adapter without the dispatcher's key takes its trial
    stack.start("remote")
    found = ended(stack, submit(stack, experiment, {"x": 1}))

    # Then the trial fails, saying which key to set (and the adapter keeps running)
    assert found["status"] == "FAILED", found
    assert "trainingService.machineList.0.password cannot be unsealed" in found["message"], found["message"]
    assert "TRIALBUS_SECRETS_KEY" in found["message"] and "the dispatcher's key" in found["message"]
    assert password not in found["message"] and password not in stack.log("remote")
    assert stack.procs["remote"].poll() is None
    # ... and a new experiment is refused at creation, with the same reason
    reply = stack.rest("POST", "/experiments", json=config)
    assert reply.status_code == 422 and "the remote adapter cannot read the experiment's secrets" in reply.text
