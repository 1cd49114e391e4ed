"""People in the web UI, as they meet it in a real headless Chromium: each logs in with their own
token, sees who is logged in, and is offered only what they may do; what they try anyway is
refused by the dispatcher, as that person, and recorded under their name."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import config
from tests.e2e.helpers import trial, wait_until
from tests.fixtures.browser import WAIT_MS, browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.stack import Stack


def add(stack: Stack, name: str, team: str, role: str = "member") -> str:
    answer = stack.rest("POST", "/users", json={"name": name, "team": team, "role": role})
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def as_(stack: Stack, token: str, method: str, path: str, **kwargs):
    return stack.rest(method, path, headers={"Authorization": f"Bearer {token}"}, **kwargs)


def test_each_person_sees_who_they_are_and_only_the_buttons_they_may_use(stack, browser, code_dir):
    ui = stack.start("webui")
    ana, bo = add(ui, "ana", "vision"), add(ui, "bo", "nlp")
    experiment = as_(ui, ana, "POST", "/experiments", json=config(code_dir)).json()["id"]
    submitted = as_(ui, ana, "POST", f"/experiments/{experiment}/trials", json={"parameters": {"x": 1, "sleep": 60}})
    trial_id = submitted.json()["id"]
    wait_until(lambda: trial(ui, trial_id)["status"] == "RUNNING", 30, "RUNNING")

    def open_as(token: str):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        assert page.goto(f"{ui.webui}/login?token={token}").ok
        page.goto(f"{ui.webui}/experiments/{experiment}")
        page.wait_for_selector(f'tr[data-trial-id="{trial_id}"][data-status="RUNNING"]')
        return context, page

    # bo, of another team, sees who he is, the experiment and its trial, and no button to change them
    context, page = open_as(bo)
    try:
        page.wait_for_function("() => document.querySelector('#whoami').textContent === 'bo (nlp, member)'")
        assert page.locator("#stop-experiment").is_hidden()
        assert page.locator(f'tr[data-trial-id="{trial_id}"] button.cancel').count() == 0
        # what he sends anyway is refused by the dispatcher as bo, with why
        answer = page.evaluate(
            "async (id) => { const r = await fetch(`/api/trials/${id}/cancel`, {method: 'POST'});"
            " return [r.status, (await r.json()).error]; }",
            trial_id,
        )
        assert answer[0] == 403 and "belongs to team vision; bo (team nlp)" in answer[1]
    finally:
        context.close()
    assert trial(ui, trial_id)["status"] == "RUNNING"

    # ana, its owner, sees her buttons and cancels her trial from the page
    context, page = open_as(ana)
    try:
        page.wait_for_function("() => document.querySelector('#whoami').textContent === 'ana (vision, member)'")
        assert page.locator("#stop-experiment").is_visible()
        page.locator(f'tr[data-trial-id="{trial_id}"] button.cancel').click()
        page.wait_for_selector(f'tr[data-trial-id="{trial_id}"][data-status="USER_CANCELED"]')
        # the experiment's activity says who tried what, newest first
        page.locator("#activity summary").click()
        page.wait_for_selector('#activity-rows tr[data-user="ana"][data-action="trial.cancel"][data-status="200"]')
        refused = page.locator('#activity-rows tr[data-user="bo"][data-action="trial.cancel"]')
        assert refused.get_attribute("data-status") == "403"
        assert "belongs to team vision" in refused.inner_text()
        rows = page.locator("#activity-rows tr")
        assert (
            rows.first.get_attribute("data-user") == "ana"
            and rows.last.get_attribute("data-action") == "experiment.create"
        )
    finally:
        context.close()

    # and the audit trail names each person, refused and done
    said = [(r["user"], r["action"], r["status"]) for r in ui.rest("GET", "/audit", params={"team": "vision"}).json()]
    assert ("bo", "trial.cancel", 403) in said and ("ana", "trial.cancel", 200) in said


def test_a_wrong_or_removed_persons_token_does_not_open_the_web_ui(stack):
    ui = stack.start("webui")
    token = add(ui, "cy", "vision")
    assert httpx.get(f"{ui.webui}/api/whoami", headers={"Authorization": f"Bearer {token}"}).json()["name"] == "cy"
    wrong = httpx.get(f"{ui.webui}/login", params={"token": "tbu_nobody-has-this-token"})
    assert wrong.status_code == 401 and "your own token" in wrong.text
    assert ui.rest("DELETE", "/users/cy").status_code == 200
    # a removed person's token stops opening the web UI once its check expires (30 s at most)
    wait_until(
        lambda: httpx.get(f"{ui.webui}/api/whoami", headers={"Authorization": f"Bearer {token}"}).status_code == 401,
        45,
        "the removed user's token to be refused",
    )
