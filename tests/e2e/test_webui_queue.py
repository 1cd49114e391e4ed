"""The queue in the web UI, as a person meets it in a real headless Chromium: two teams share one
(fake) GPU, one team's trial holds it, the other's waits; the page shows the waiting experiment
with its team and why it waits, and the teams' use, as the dispatcher says them (docs/webui.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from tests.e2e.conftest import config
from tests.e2e.helpers import trial, wait_until
from tests.fixtures.browser import WAIT_MS, browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.gpus import fake_gpu, stack_env
from tests.fixtures.stack import Stack


def test_the_queue_page_shows_who_waits_by_team_and_why(tmp_path, nats_server, browser, code_dir):
    stack = Stack(
        root=tmp_path, nats=nats_server, extra_env=stack_env(tmp_path, [fake_gpu(0)], TRIALBUS_STATUS_INTERVAL="1")
    )
    try:
        stack.start("dispatcher", "gateway", "adapter", "webui")
        _queue_shows_the_waiting_experiment(stack, browser, code_dir, tmp_path)
    except BaseException:
        print(stack.logs(), file=sys.stderr)
        raise
    finally:
        stack.stop()


def _queue_shows_the_waiting_experiment(stack: Stack, browser, code_dir, tmp_path: Path) -> None:
    wait_until(lambda: any(p["gpus"] for p in stack.rest("GET", "/platforms").json()), 20, "the fake GPU published")
    tokens = {}
    for name, team in (("ana", "vision"), ("bo", "nlp")):
        added = stack.rest("POST", "/users", json={"name": name, "team": team, "role": "member"})
        assert added.status_code == 201, added.text
        tokens[name] = {"Authorization": f"Bearer {added.json()['token']}"}
    gpu_config = config(
        code_dir, trialConcurrency=1, trialGpuNumber=1, trainingService={"platform": "local", "useActiveGpu": True}
    )

    # Given bo's page on the queue while nothing waits
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        assert page.goto(f"{stack.webui}/login?token={tokens['bo']['Authorization'].split()[1]}").ok
        page.goto(f"{stack.webui}/queue")
        page.wait_for_selector("#queue-empty:visible")
        assert page.locator("#queue-empty").inner_text() == "Nothing waits for capacity."

        # When team vision's trial holds the only GPU and team nlp's trial waits for it
        held = stack.rest("POST", "/experiments", json=gpu_config, headers=tokens["ana"]).json()["id"]
        holder = stack.rest(
            "POST", f"/experiments/{held}/trials", json={"parameters": {"x": 1, "sleep": 60}}, headers=tokens["ana"]
        ).json()["id"]
        wait_until(lambda: trial(stack, holder)["status"] == "RUNNING", 20, "vision's trial RUNNING")
        waits = stack.rest("POST", "/experiments", json=gpu_config, headers=tokens["bo"]).json()["id"]
        stack.rest("POST", f"/experiments/{waits}/trials", json={"parameters": {"x": 2}}, headers=tokens["bo"])

        # Then the page shows it (without a reload): its position, team and why it waits
        local = '#queue-platforms article[data-platform="local-gpu"]'
        row = page.wait_for_selector(f'{local} tr[data-experiment="{waits}"]')
        assert row.get_attribute("data-team") == "nlp" and row.get_attribute("data-position") == "1"
        assert row.query_selector("td.why").inner_text().startswith("waiting for 1 free GPU (0 of 1 GPUs of local-gpu")
        assert page.locator("#queue-empty").is_hidden()
        # And the teams' shares: vision uses the GPU (borrowed: it has no quota), nlp waits with one experiment
        vision = page.wait_for_selector('#teams-rows tr[data-team="vision"][data-platform="local-gpu"]')
        assert "1 of 1 GPU, 1 of 64 trials in use" in vision.inner_text()
        assert vision.query_selector("td.borrowed").inner_text() == "1 GPU"
        nlp = page.locator('#teams-rows tr[data-team="nlp"][data-platform="local-gpu"] td').last
        assert nlp.inner_text() == "1"
        page.screenshot(path=str(Path(os.environ.get("TRIALBUS_ARTIFACTS") or tmp_path) / "webui-queue.png"))

        # And the JSON routes answer as the dispatcher does, and refuse who has no token
        for ours, theirs in (("/api/queue", "/queue"), ("/api/teams", "/teams")):
            wait_until(
                lambda ours=ours, theirs=theirs: (
                    httpx.get(f"{stack.webui}{ours}", headers=tokens["bo"]).json()
                    == stack.rest("GET", theirs, headers=tokens["bo"]).json()
                ),
                10,
                f"{ours} to answer as the dispatcher's {theirs}",
            )
            refused = httpx.get(f"{stack.webui}{ours}")
            assert refused.status_code == 401 and "/login?token=" in refused.json()["error"], ours

        # And the experiment's id leads to its page
        row.query_selector("a").click()
        page.wait_for_url(f"{stack.webui}/experiments/{waits}")
        page.wait_for_selector(f'#exp-id:text-is("{waits}")')
    finally:
        context.close()
