"""Only an authorised caller can make the dispatcher run a command, and no web page can.

Each attack is sent as a browser or a local program would send it, to a real dispatcher; each
is refused with a message that says what to send, and creates nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.fixtures.stack import Stack

EXPERIMENT = {
    "trialCommand": "touch /tmp/pwned",
    "trialConcurrency": 1,
    "trainingService": {"platform": "local"},
    "tuner": {"name": "Random"},
    "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
}
READ_TOKEN = "read-only-token-for-dashboards"


def experiments(stack: Stack) -> list:
    return stack.rest("GET", "/experiments").json()


def refused(answer: httpx.Response, status: int, words: str) -> None:
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert words in answer.json()["error"], answer.text


@pytest.fixture
def dispatcher(tmp_path, nats_server):
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_API_READ_TOKEN": READ_TOKEN})
    stack.start("dispatcher")
    yield stack
    stack.stop()


@pytest.fixture
def tokenless(tmp_path, nats_server):
    """A dispatcher run without a token, as the explicit setting allows, asked to bind every address."""
    settings = {"TRIALBUS_API_AUTH": "none", "TRIALBUS_API_HOST": "0.0.0.0"}
    stack = Stack(root=tmp_path, nats=nats_server, extra_env=settings)
    stack.env = lambda name="", env=stack.env: {k: v for k, v in env(name).items() if k != "TRIALBUS_API_TOKEN"}
    stack.start("dispatcher")
    yield stack
    stack.stop()


def test_no_token_no_experiment(dispatcher: Stack):
    anonymous = httpx.post(f"{dispatcher.api}/experiments", json=EXPERIMENT, timeout=10)
    refused(anonymous, 401, "Authorization: Bearer")
    wrong = httpx.post(
        f"{dispatcher.api}/experiments",
        json=EXPERIMENT,
        timeout=10,
        headers={"Authorization": "Bearer guessed-token-123456"},
    )
    refused(wrong, 401, "wrong bearer token")
    assert experiments(dispatcher) == []
    assert dispatcher.rest("POST", "/experiments", json=EXPERIMENT).status_code == 201


def test_the_read_only_token_reads_and_changes_nothing(dispatcher: Stack):
    reader = {"Authorization": f"Bearer {READ_TOKEN}"}
    created = dispatcher.rest("POST", "/experiments", json=EXPERIMENT).json()["id"]
    assert dispatcher.rest("GET", f"/experiments/{created}", headers=reader).status_code == 200
    refused(dispatcher.rest("POST", "/experiments", json=EXPERIMENT, headers=reader), 403, "read-only token")
    refused(dispatcher.rest("DELETE", f"/experiments/{created}", headers=reader), 403, "read-only token")
    assert [e["id"] for e in experiments(dispatcher)] == [created]
    assert dispatcher.rest("GET", f"/experiments/{created}").json()["status"] == "RUNNING"


def test_a_web_page_cannot_create_an_experiment_even_without_a_token(tokenless: Stack):
    api = tokenless.api
    # A "simple" cross-site POST (no preflight): text/plain or a form with the JSON inside. Refused
    # for its Origin, and for its Content-Type where no Origin came with it.
    body = httpx.Request("POST", "/", json=EXPERIMENT).content
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        simple = httpx.post(
            f"{api}/experiments",
            content=body,
            timeout=10,
            headers={"Content-Type": content_type, "Origin": "http://evil.example"},
        )
        refused(simple, 403, "cross-site request from http://evil.example refused")
        bare = httpx.post(f"{api}/experiments", content=body, headers={"Content-Type": content_type}, timeout=10)
        refused(bare, 415, "Content-Type: application/json")
    # A page of another site, with JSON (a browser would preflight; this is what the server sees)
    foreign = httpx.post(f"{api}/experiments", json=EXPERIMENT, headers={"Origin": "http://evil.example"}, timeout=10)
    refused(foreign, 403, "cross-site request from http://evil.example refused")
    # DNS rebinding: the attacker's name resolves to 127.0.0.1, the browser sends its Host
    rebound = httpx.get(f"{api}/experiments", headers={"Host": "evil.example:8080"}, timeout=10)
    refused(rebound, 400, "does not answer to Host 'evil.example:8080'")
    assert httpx.get(f"{api}/experiments", timeout=10).json() == [], "nothing was created"
    # A program on this machine (no Origin, JSON) may: that is what TRIALBUS_API_AUTH=none means
    assert httpx.post(f"{api}/experiments", json=EXPERIMENT, timeout=10).status_code == 201


def test_without_a_token_the_dispatcher_binds_loopback_and_says_so(tokenless: Stack):
    pid = tokenless.procs["dispatcher"].pid
    listening = {c.laddr for c in psutil.Process(pid).net_connections() if c.status == psutil.CONN_LISTEN}
    assert ("127.0.0.1", tokenless.api_port) in listening and not any(a.ip == "0.0.0.0" for a in listening)
    log = tokenless.log("dispatcher")
    assert "TRIALBUS_API_AUTH=none, so it binds 127.0.0.1, not 0.0.0.0" in log
    assert "WITHOUT an API token" in log


def test_the_dispatcher_refuses_to_start_without_a_token(tmp_path, nats_server):
    env = Stack(root=tmp_path, nats=nats_server).env("dispatcher")
    del env["TRIALBUS_API_TOKEN"]
    began = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "services.dispatcher"], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0 and time.monotonic() - began < 60
    assert "TRIALBUS_API_TOKEN is not set" in run.stderr and "TRIALBUS_API_AUTH=none" in run.stderr, run.stderr
    short = {**env, "TRIALBUS_API_TOKEN": "short"}
    run = subprocess.run(
        [sys.executable, "-m", "services.dispatcher"], env=short, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0 and "TRIALBUS_API_TOKEN: a token must have at least 16 characters" in run.stderr


def test_cors_opens_only_to_the_origins_configured(tmp_path, nats_server):
    dashboard = "https://dash.example.com"
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_ALLOWED_ORIGINS": dashboard})
    stack.start("dispatcher")
    try:
        asked = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        preflight = httpx.options(f"{stack.api}/experiments", headers={"Origin": dashboard, **asked}, timeout=10)
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == dashboard
        other = httpx.options(
            f"{stack.api}/experiments", headers={"Origin": "http://evil.example", **asked}, timeout=10
        )
        assert "access-control-allow-origin" not in other.headers
        created = stack.rest("POST", "/experiments", json=EXPERIMENT, headers={"Origin": dashboard})
        assert created.status_code == 201 and created.headers["access-control-allow-origin"] == dashboard
        refused(
            stack.rest("POST", "/experiments", json=EXPERIMENT, headers={"Origin": "http://evil.example"}),
            403,
            "cross-site request from http://evil.example refused",
        )
    finally:
        stack.stop()


def test_no_cors_by_default(dispatcher: Stack):
    answer = dispatcher.rest("GET", "/experiments", headers={"Origin": "https://dash.example.com"})
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers
