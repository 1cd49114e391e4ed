"""The "All experiments" page as a person meets it in a real headless Chromium, on a real stack:
three experiments of different states with their trials counted, filtered and sorted through
the URL (a reload shows the same), stopped, resumed, deleted (after a confirmation) and exported
from the page; a viewer sees the list and no button that would change it (docs/webui.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, trial, wait_until
from tests.fixtures.browser import WAIT_MS, browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.stack import Stack


def row(experiment: str, status: str | None = None) -> str:
    return f'#experiments-rows tr[data-experiment="{experiment}"]' + (f'[data-status="{status}"]' if status else "")


def names(page) -> list[str]:
    return page.locator('#experiments-rows td[data-column="name"]').all_inner_texts()


@pytest.fixture
def open_page(browser):
    contexts = []

    def open_as(ui: Stack, token: str, path: str = "/experiments"):
        context = browser.new_context(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        assert page.goto(f"{ui.webui}/login?token={token}").ok
        page.goto(f"{ui.webui}{path}")
        return page, errors

    yield open_as
    for context in contexts:
        context.close()


def test_every_experiment_listed_filtered_sorted_and_acted_on(stack: Stack, open_page, code_dir: Path) -> None:
    ui = stack.start("webui")
    # Given three experiments: one running a trial, one stopped, one done (its one trial ended)
    running = create(ui, config(code_dir, experimentName="list-running"))
    sleeper = submit(ui, running, {"x": 1, "sleep": 120})
    stopped = create(ui, config(code_dir, experimentName="list-stopped"))
    ended(ui, submit(ui, stopped, {"x": 0.25}))
    assert ui.rest("DELETE", f"/experiments/{stopped}").status_code == 200  # the REST API's stop
    done = create(ui, config(code_dir, experimentName="list-done", maxTrialNumber=1))
    ended(ui, submit(ui, done, {"x": 0.75}))
    wait_until(lambda: ui.rest("GET", f"/experiments/{done}").json()["status"] == "DONE", 20, "DONE")
    wait_until(lambda: trial(ui, sleeper)["status"] == "RUNNING", 30, "the sleeper RUNNING")

    page, errors = open_page(ui, ui.token)
    # Then each is listed with its status and its trials by status, and its best metric
    page.wait_for_selector(row(running, "RUNNING") + ' li[data-status="RUNNING"][data-count="1"]')
    page.wait_for_selector(row(stopped, "STOPPED") + ' li[data-status="SUCCEEDED"][data-count="1"]')
    page.wait_for_selector(row(done, "DONE") + ' li[data-status="SUCCEEDED"][data-count="1"]')
    assert page.locator(row(done) + ' td[data-column="best"]').inner_text() == "0.75 (trial 0)"
    assert page.locator(row(done) + ' td[data-column="platform"]').inner_text() == "local"
    assert page.locator("#experiments-count").inner_text() == "3 experiments"
    assert names(page) == ["list-done", "list-stopped", "list-running"], "newest first"
    assert page.locator("#experiments-link").get_attribute("aria-current") == "page"
    assert page.evaluate("() => performance.getEntriesByName('trialbus:experiments').length") == 1

    # a keyboard's focus stays on a row's button while the list is read again (every 2 s; its duration moves)
    page.locator(row(running) + " button.stop").focus()
    page.wait_for_timeout(2500)
    assert page.evaluate("() => document.activeElement.className") == "stop"
    assert page.evaluate("() => document.activeElement.closest('tr').dataset.experiment") == running

    # When sorted by name, then filtered by status: the URL holds the view, a reload shows it again
    page.get_by_role("button", name="Name", exact=True).click()
    page.wait_for_function("() => location.search.includes('sort=name')")
    wait_until(lambda: names(page) == ["list-done", "list-running", "list-stopped"], 10, "sorted by name")
    assert page.locator('th[data-column="name"]').get_attribute("aria-sort") == "ascending"
    page.get_by_role("button", name="Name", exact=True).click()
    wait_until(lambda: names(page) == ["list-stopped", "list-running", "list-done"], 10, "by name, descending")
    page.locator("#experiments-filter").get_by_label("Status", exact=True).select_option("STOPPED")
    page.wait_for_function("() => location.search.includes('status=STOPPED')")
    wait_until(lambda: names(page) == ["list-stopped"], 10, "only the stopped one")
    page.reload()
    page.wait_for_selector(row(stopped))
    assert (
        names(page) == ["list-stopped"]
        and page.locator("#experiments-filter").get_by_label("Status", exact=True).input_value() == "STOPPED"
    )
    assert page.locator('th[data-column="name"]').get_attribute("aria-sort") == "descending"
    page.locator("#experiments-filter").get_by_label("Status", exact=True).select_option("")
    page.get_by_label("Name or id").fill("DONE")
    wait_until(lambda: names(page) == ["list-done"], 10, "the text filter")
    page.get_by_label("Name or id").fill("")
    wait_until(lambda: len(names(page)) == 3, 10, "every experiment again")

    # When the running one is stopped from the page, then resumed
    page.locator(row(running) + " button.stop").click()
    page.wait_for_selector(row(running, "STOPPED") + ' li[data-status="USER_CANCELED"]')
    wait_until(lambda: trial(ui, sleeper)["status"] == "USER_CANCELED", 10, "the sleeper canceled")
    page.locator(row(running) + " button.resume").click()
    page.wait_for_selector(row(running, "RUNNING"))
    assert ui.rest("GET", f"/experiments/{running}").json()["status"] == "RUNNING"
    # and the same on selected rows: the selection is in the URL too
    page.get_by_label(f"Select experiment list-running ({running})").check()
    page.wait_for_function("id => location.search.includes(`selected=${id}`)", arg=running)
    assert page.locator("#experiments-bulk .bulk-resume").is_disabled()
    page.get_by_role("button", name="Stop selected").click()
    page.wait_for_selector(row(running, "STOPPED"))
    page.get_by_role("button", name="Resume selected").click()
    page.wait_for_selector(row(running, "RUNNING"))
    page.get_by_label(f"Select experiment list-running ({running})").uncheck()
    page.wait_for_function("() => !location.search.includes('selected=')")
    # a refusal is shown to the person (a running experiment cannot be deleted: the dispatcher says why)
    answer = page.evaluate(
        "async (id) => { const r = await fetch(`/api/experiments/${id}/delete`, {method: 'POST'});"
        " return [r.status, (await r.json()).error]; }",
        running,
    )
    assert answer[0] == 409, answer

    # When the stopped one is deleted: first kept (the dialog's "Keep it"), then deleted once confirmed
    page.locator(row(stopped) + " button.delete").click()
    page.locator("#confirm-delete-no").click()
    assert page.locator(row(stopped)).count() == 1
    page.locator(row(stopped) + " button.delete").click()
    assert page.locator("#confirm-delete-id").inner_text() == stopped
    page.locator("#confirm-delete-yes").click()
    page.wait_for_selector(row(stopped), state="detached")
    wait_until(lambda: ui.rest("GET", f"/experiments/{stopped}").status_code == 404, 10, "deleted")

    # And the done one's trials download as JSON and as CSV (trialbus experiment export's format)
    with page.expect_download() as download:
        page.locator(row(done) + ' a.export[data-format="json"]').click()
    exported = json.loads(Path(download.value.path()).read_text())
    assert [(r["parameter"]["x"], r["status"]) for r in exported] == [(0.75, "SUCCEEDED")]
    assert json.loads(exported[0]["value"])["default"] == 0.75
    assert download.value.suggested_filename == f"{done}-trials.json"
    with page.expect_download() as download:
        page.locator(row(done) + ' a.export[data-format="csv"]').click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert lines[0].split(",")[:2] == ["x", "default"] and lines[1].startswith("0.75,0.75,")
    assert not errors, errors

    # And a viewer sees the list, and no button that would change it
    viewer = ui.rest("POST", "/users", json={"name": "vi", "team": "vision", "role": "viewer"}).json()["token"]
    seen, errors = open_page(ui, viewer)
    seen.wait_for_selector(row(running, "RUNNING"))
    seen.wait_for_selector(row(done))
    assert seen.locator("#experiments-rows button, #experiments-rows input").count() == 0
    assert seen.locator("#experiments-bulk").is_hidden()
    assert seen.locator(row(done) + " a.export").count() == 2, "exporting is reading: viewers may"
    refused = seen.evaluate(
        "async (id) => (await fetch(`/api/experiments/${id}/stop`, {method: 'POST'})).status", running
    )
    assert refused == 403 and not errors, errors
