"""Bad input gets a 4xx a person can act on; nothing is published and state is unchanged."""

from __future__ import annotations

import asyncio

import nats
import pytest

from tests.fixtures.stack import Stack

TOKEN = "s3cret-api-token"
JSON = {"Content-Type": "application/json"}
GZIP = {"Content-Type": "application/gzip"}
GOOD = {"trialCommand": "python3 trial.py", "trialConcurrency": 1, "trainingService": {"platform": "local"}}


@pytest.fixture
def api(tmp_path, nats_server):
    stack = Stack(
        root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_API_TOKEN": TOKEN, "TRIALBUS_API_MAX_BODY": "4096"}
    )
    stack.start("dispatcher")
    yield stack
    stack.stop()


def call(stack: Stack, method: str, path: str, token: str | None = TOKEN, **kwargs):
    headers = dict(kwargs.pop("headers", {}))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return stack.rest(method, path, headers=headers, **kwargs)


async def bus_snapshot(url: str) -> dict:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        snapshot = {name: (await js.stream_info(name)).state.messages for name in ("DISPATCH", "EVENTS", "METRICS")}
        for bucket in ("experiments", "trials"):
            snapshot[bucket] = (await js.stream_info(f"KV_{bucket}")).state.messages
        return snapshot
    finally:
        await nc.close()


def test_bad_requests_are_refused_and_change_nothing(api):
    experiment = call(api, "POST", "/experiments", json={**GOOD, "maxTrialNumber": 1}).json()["id"]
    before = asyncio.run(bus_snapshot(api.nats.url))
    cases = [
        # (method, path, kwargs, token, status, words in the message)
        ("GET", "/experiments", {}, None, 401, "Authorization: Bearer"),
        ("GET", "/experiments", {}, "wrong", 401, "wrong bearer token"),
        ("POST", "/experiments", {"content": b"{not json", "headers": JSON}, TOKEN, 400, "not valid JSON"),
        ("POST", "/experiments", {"json": [1, 2]}, TOKEN, 400, "JSON object"),
        ("POST", "/experiments", {"json": {**GOOD, "trialConcurrency": -2}}, TOKEN, 422, "trialConcurrency"),
        (
            "POST",
            "/experiments",
            {"json": {**GOOD, "trainingService": {"platform": "mars"}}},
            TOKEN,
            422,
            "unknown platform 'mars'",
        ),
        ("POST", "/experiments", {"json": {**GOOD, "tunerr": {}}}, TOKEN, 422, "does not have field(s) tunerr"),
        ("POST", "/experiments", {"content": b"{" + b" " * 5000 + b"}", "headers": JSON}, TOKEN, 413, "over the limit"),
        (
            "POST",
            "/experiments",
            {"json": {**GOOD, "trialCodeDirectory": "/nonexistent/code"}},
            TOKEN,
            422,
            "/nonexistent/code",
        ),
        ("GET", "/experiments/nope", {}, TOKEN, 404, "experiment 'nope' not found"),
        ("POST", "/experiments/nope/trials", {"json": {"parameters": {}}}, TOKEN, 404, "experiment 'nope' not found"),
        (
            "POST",
            f"/experiments/{experiment}/trials",
            {"json": {"parameters": [1]}},
            TOKEN,
            422,
            "parameters must be a JSON object",
        ),
        ("POST", f"/experiments/{experiment}/trials", {"json": {"params": {}}}, TOKEN, 422, "unknown field(s) params"),
        ("GET", "/trials/nope", {}, TOKEN, 404, "trial 'nope' not found"),
        ("POST", "/trials/nope/cancel", {}, TOKEN, 404, "trial 'nope' not found"),
        ("GET", "/trials/nope/log", {}, TOKEN, 404, "trial 'nope' not found"),
        ("POST", "/code", {"content": b"this is not a tar.gz", "headers": GZIP}, TOKEN, 400, "tar.gz"),
    ]
    for method, path, kwargs, token, status, words in cases:
        answer = call(api, method, path, token, **kwargs)
        assert answer.status_code == status, (method, path, answer.status_code, answer.text)
        assert words in answer.json()["error"], (method, path, answer.text)
    assert asyncio.run(bus_snapshot(api.nats.url)) == before
    assert call(api, "GET", f"/experiments/{experiment}").json()["trialCount"] == 0


def test_bad_requests_over_nats_get_the_same_answers(api):
    async def scenario():
        nc = await nats.connect(api.nats.url)
        try:

            async def ask(op: str, payload: bytes) -> dict:
                import json

                return json.loads((await nc.request(f"trialbus.api.{op}", payload, timeout=5)).data)

            assert (await ask("trial.get", b'{"id": "nope"}')) == {
                "ok": False,
                "status": 404,
                "error": "trial 'nope' not found",
            }
            bad = await ask("experiment.create", b"{oops")
            assert bad["status"] == 400 and "not valid JSON" in bad["error"]
            unknown = await ask("experiment.explode", b"{}")
            assert unknown["status"] == 404 and "experiment.create" in unknown["error"]
            # How a cancel ends a trial: a person's cancel or an assessor's early stop, nothing else.
            status = await ask("trial.cancel", b'{"id": "nope", "status": "SUCCEEDED"}')
            assert status["status"] == 422 and "USER_CANCELED, EARLY_STOPPED" in status["error"]
            long = await ask(
                "trial.cancel", b'{"id": "nope", "status": "EARLY_STOPPED", "message": "%s"}' % (b"x" * 1001)
            )
            assert long["status"] == 422 and "at most 1000 characters" in long["error"]
            assert (await ask("experiment.close", b'{"id": "nope"}'))["status"] == 404
        finally:
            await nc.close()

    asyncio.run(scenario())
