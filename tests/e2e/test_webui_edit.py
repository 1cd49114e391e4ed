"""Editing a running experiment from its page in a real headless Chromium: the Edit dialog changes its
concurrency, the dispatcher fills the new slots, and the page shows it; a bad value is refused in the dialog
with the dispatcher's message; a viewer is offered no Edit button."""

from __future__ import annotations

from tests.e2e.conftest import config
from tests.e2e.helpers import submit, wait_until
from tests.fixtures.browser import WAIT_MS, browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.stack import Stack


def running(ui: Stack, experiment: str) -> int:
    return ui.rest("GET", f"/experiments/{experiment}").json()["trialCounts"].get("RUNNING", 0)


def test_the_edit_dialog_raises_concurrency_and_the_page_shows_four_running(stack: Stack, browser, code_dir) -> None:
    ui = stack.start("webui")
    experiment = ui.rest("POST", "/experiments", json=config(code_dir, trialConcurrency=2)).json()["id"]
    for x in range(5):
        submit(ui, experiment, {"x": x, "sleep": 60})
    wait_until(lambda: running(ui, experiment) == 2, 30, "2 trials RUNNING")
    viewer = ui.rest("POST", "/users", json={"name": "vi", "team": "vision", "role": "viewer"}).json()["token"]

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.on("pageerror", lambda error: errors.append(str(error)))
        assert page.goto(f"{ui.webui}/login?token={ui.token}").ok
        page.goto(f"{ui.webui}/experiments/{experiment}")
        page.wait_for_selector('#exp-counts li[data-status="RUNNING"] b:text-is("2")')

        # a bad value: the dialog says why and stays open; nothing changed
        page.get_by_role("button", name="Edit").click()
        assert "edit=1" in page.url  # the open dialog is in the URL
        assert page.locator("#edit-trialConcurrency").input_value() == "2"
        page.get_by_label("Max duration").fill("2 fortnights")
        page.get_by_role("button", name="Save").click()
        page.wait_for_selector('#edit-error:has-text("bad duration")')
        assert page.locator("#edit-experiment-dialog").is_visible()

        # the concurrency, as a user types it: 4 RUNNING, the page's facts say 4
        page.get_by_label("Max duration").fill("")
        page.get_by_label("Concurrency").fill("4")
        page.get_by_role("button", name="Save").click()
        page.wait_for_selector("#toast:has-text('trialConcurrency 2 → 4')")
        assert not page.locator("#edit-experiment-dialog").is_visible() and "edit=1" not in page.url
        page.wait_for_selector('#exp-concurrency:text-is("4")')
        page.wait_for_selector('#exp-counts li[data-status="RUNNING"] b:text-is("4")')
        assert ui.rest("GET", f"/experiments/{experiment}").json()["config"]["trialConcurrency"] == 4
        said = ui.rest("GET", "/audit", params={"experiment": experiment}).json()
        assert any(r["action"] == "experiment.update" and r["message"] == "trialConcurrency 2 → 4" for r in said)
    finally:
        context.close()
    assert not errors, errors

    # a viewer sees the experiment and no Edit button; what they send anyway is refused
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        assert page.goto(f"{ui.webui}/login?token={viewer}").ok
        page.goto(f"{ui.webui}/experiments/{experiment}")
        page.wait_for_function("() => document.querySelector('#whoami').textContent === 'vi (vision, viewer)'")
        page.wait_for_selector('#exp-counts li[data-status="RUNNING"] b:text-is("4")')
        assert page.locator("#edit-experiment").is_hidden()
        status = page.evaluate(
            "async (id) => (await fetch(`/api/experiments/${id}`, {method: 'PATCH', "
            "headers: {'Content-Type': 'application/json'}, body: '{\"trialConcurrency\": 1}'})).status",
            experiment,
        )
        assert status == 403
    finally:
        context.close()
    ui.rest("DELETE", f"/experiments/{experiment}")
