"""A browser pointed at the dispatcher's address (its ``/``) is told where the web UI is, and the API docs.

Over real HTTP: the stack of ``trialbus up`` on free ports (the page links the web UI on its own
port), and a dispatcher alone (no address given: the page says how to find it; a malformed one
stops it at start, naming the setting).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures.nats import nats_server_binary, require_binary
from tests.fixtures.stack import Stack
from tests.fixtures.up import Up, new_ports, processes

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def links(page: str) -> dict[str, str]:
    """The page's links by id (``webui``, ``docs``)."""
    return dict(re.findall(r'<a id="(\w+)" href="([^"]+)"', page))


@pytest.fixture
def up(tmp_path: Path):
    require_binary(nats_server_binary(), "nats-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"}
    data_dir = tmp_path / "data"
    up = Up(data_dir, new_ports(), {**env, "COLUMNS": "300"}, tmp_path / "up.log")
    yield up
    up.kill()
    if (data_dir / "stack.json").exists():
        for process in processes(data_dir).values():
            process.kill()


def test_the_api_address_in_a_browser_links_the_stacks_own_web_ui_and_the_api_docs(up: Up) -> None:
    # Given `trialbus up` on ports other than the defaults
    up.wait_for("Trialbus is up")
    api = f"http://127.0.0.1:{up.ports['api']}"

    # When a browser opens the API's address, without a token
    page = httpx.get(f"{api}/", headers=BROWSER, timeout=10)

    # Then it gets a page that links the web UI on the stack's own port, and the API docs
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text
    found = links(page.text)
    assert found["webui"] == f"http://127.0.0.1:{up.ports['webui']}", page.text
    assert "Trialbus API" in page.text

    # And both links lead somewhere: the web UI (once logged in with the token) and the docs page
    with httpx.Client(base_url=found["webui"], timeout=10) as browser:
        assert browser.get(f"/login?token={up.local.api_token}", follow_redirects=True).status_code == 200
    docs = httpx.get(f"{api}{found['docs']}", headers=BROWSER, timeout=10)
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_a_dispatcher_not_told_the_web_ui_address_says_how_to_find_it(tmp_path: Path, nats_server) -> None:
    # Given a dispatcher run on its own, without TRIALBUS_WEBUI_URL
    stack = Stack(root=tmp_path, nats=nats_server).start("dispatcher")
    try:
        # When a browser opens its address
        page = httpx.get(f"http://127.0.0.1:{stack.api_port}/", headers=BROWSER, timeout=10)
        # Then the page says where the address comes from and how to find the web UI, and links the docs
        assert page.status_code == 200, page.text
        assert "TRIALBUS_WEBUI_URL" in page.text and "trialbus view" in page.text
        assert "webui" not in links(page.text) and links(page.text)["docs"] == "/api/docs"
        # And a Host that is not this machine's (DNS rebinding) gets nothing
        rebound = httpx.get(f"http://127.0.0.1:{stack.api_port}/", headers={**BROWSER, "Host": "evil.example"})
        assert rebound.status_code == 400 and "Host" in rebound.json()["error"]
    finally:
        stack.stop()


def test_a_malformed_web_ui_address_stops_the_dispatcher_at_start_naming_the_setting(
    tmp_path: Path, nats_server
) -> None:
    stack = Stack(root=tmp_path, nats=nats_server, extra_env={"TRIALBUS_WEBUI_URL": "localhost:8082"})
    started = subprocess.run(
        [sys.executable, "-m", "services.dispatcher"],
        env=stack.env("dispatcher"),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert started.returncode != 0
    assert "TRIALBUS_WEBUI_URL" in started.stdout + started.stderr, started.stdout + started.stderr
