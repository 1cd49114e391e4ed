"""Add a trial and the experiment's own logs, as people use them in a real headless Chromium on the stack as
processes (the tuner service with the real nni package): a trial copied from another and edited runs with the
typed parameters and its result reaches the user's tuner as NNI's customized trial; a viewer is offered no
button and is refused; the Logs view shows the dispatcher's and the tuner's lines about the experiment, live,
and its config with the platform's token masked."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.helpers import trial, wait_until
from tests.fixtures.browser import WAIT_MS, browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.nni import nni_tuner_stack
from tests.fixtures.stack import Stack

# A trial that keeps its parameter record (NNI's parameter.cfg) beside the "hold" file, waits for that file (60 s
# at most), then reports x as its final result.
TRIAL = textwrap.dedent(
    """
    import os, shutil, time
    import nni

    params = nni.get_next_parameter()
    if params.get("hold"):
        shutil.copy(os.path.join(os.environ["NNI_SYS_DIR"], "parameter.cfg"), f"{params['hold']}-{params['x']}.cfg")
    deadline = time.time() + 60
    while params.get("hold") and not os.path.exists(params["hold"]) and time.time() < deadline:
        time.sleep(0.1)
    nni.report_final_result(params["x"])
    """
)

# A user's NNI tuner that proposes its list and writes down every result it receives, customized ones too.
RECORDING_TUNER = textwrap.dedent(
    """
    import json
    from nni.tuner import Tuner

    class RecordingTuner(Tuner):
        def __init__(self, trials, journal):
            self.trials, self.journal = trials, journal
            self._accept_customized_trials()

        def update_search_space(self, search_space):
            pass

        def generate_parameters(self, parameter_id, **kwargs):
            return self.trials[parameter_id % len(self.trials)]

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            with open(self.journal, "a") as out:
                out.write(json.dumps([parameter_id, parameters, value, kwargs]) + "\\n")
    """
)
SECRET = "pai-token-never-shown-5f3e"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with nni_tuner_stack(tmp_path_factory.mktemp("webui-addtrial")) as stack:
        stack.start("webui")
        yield stack


def add_user(stack: Stack, name: str, team: str, role: str) -> str:
    answer = stack.rest("POST", "/users", json={"name": name, "team": team, "role": role})
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def open_page(browser, stack: Stack, token: str, path: str):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    assert page.goto(f"{stack.webui}/login?token={token}").ok
    page.goto(f"{stack.webui}{path}")
    return context, page


def post_trial(page, experiment_id: str, parameters) -> list:
    return page.evaluate(
        "async ([id, parameters]) => { const r = await fetch(`/api/experiments/${id}/trials`, {method: 'POST',"
        " headers: {'Content-Type': 'application/json'}, body: JSON.stringify({parameters})});"
        " return [r.status, (await r.json()).error]; }",
        [experiment_id, parameters],
    )


def test_a_trial_added_from_the_page_runs_with_the_typed_parameters_and_reaches_the_tuner(
    stack: Stack, browser, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    (code / "recording_tuner.py").write_text(RECORDING_TUNER)
    journal, release = tmp_path / "journal.jsonl", tmp_path / "release"
    ana = add_user(stack, "ana", "vision", "member")
    viewer = add_user(stack, "vic", "vision", "viewer")
    planned = {"x": 1, "hold": str(release)}
    config = {
        "experimentName": "add-trial",
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 1,
        "maxTrialNumber": 2,
        "searchSpace": {"x": {"_type": "choice", "_value": [1, 2, 3]}},
        "tuner": {
            "className": "recording_tuner.RecordingTuner",
            "codeDirectory": str(code),
            "classArgs": {"trials": [planned], "journal": str(journal)},
        },
        "trainingService": {"platform": "local"},
    }
    created = stack.rest("POST", "/experiments", json=config, headers={"Authorization": f"Bearer {ana}"})
    assert created.status_code == 201, created.text
    experiment = created.json()["id"]

    context, page = open_page(browser, stack, ana, f"/experiments/{experiment}")
    try:
        page.wait_for_function("() => document.querySelector('#whoami').textContent === 'ana (vision, member)'")
        first = page.locator('#trials tbody tr[data-status="RUNNING"]')
        first.wait_for()
        first_id = first.get_attribute("data-trial-id")
        # copied from the tuner's trial, from its detail: the form holds its parameters, the URL says so
        first.click()
        page.locator("#detail-copy").click()
        page.locator("#add-trial-dialog[open]").wait_for()
        assert json.loads(page.locator("#add-trial-json").input_value()) == planned
        assert f"add={first_id}" in page.url
        # the form copies a trial by its number too
        page.locator('#add-trial-fields input[data-name="x"]').fill("3")
        page.locator("#add-trial-from").fill("0")
        page.locator("#add-trial-copy").click()
        page.locator("#add-trial-json").wait_for()
        wait_until(lambda: json.loads(page.locator("#add-trial-json").input_value()) == planned, 15, "trial 0 copied")
        # x typed in its field: the JSON follows; added, the trial shows in the table
        page.locator('#add-trial-fields input[data-name="x"]').fill("9")
        assert json.loads(page.locator("#add-trial-json").input_value()) == {**planned, "x": 9}
        page.locator("#add-trial-submit").click()
        page.locator("#add-trial-dialog[open]").wait_for(state="detached")
        added = page.locator(f'#trials tbody tr:not([data-trial-id="{first_id}"])')
        added.wait_for()
        added_id = added.get_attribute("data-trial-id")
        # maxTrialNumber (2) is reached: the form says so, and the dispatcher refuses one more
        page.locator("#detail-close").click()
        page.locator("#add-trial").click()
        page.locator('#add-trial-note[data-refused="true"]').wait_for()
        assert "maxTrialNumber (2" in page.locator("#add-trial-note").inner_text()
        assert page.locator("#add-trial-submit").is_disabled()
        page.keyboard.press("Escape")
        status, error = post_trial(page, experiment, {"x": 2})
        assert status == 409 and "maxTrialNumber" in error, error
        status, error = post_trial(page, experiment, [1, 2])
        assert status == 400 and "JSON object" in error, error
    finally:
        context.close()

    # a viewer has no button, and is refused
    context, page = open_page(browser, stack, viewer, f"/experiments/{experiment}")
    try:
        page.wait_for_function("() => document.querySelector('#whoami').textContent === 'vic (vision, viewer)'")
        page.locator("#trials tbody tr").first.wait_for()
        assert page.locator("#add-trial").is_hidden()
        status, error = post_trial(page, experiment, {"x": 2})
        assert status == 403 and "viewer" in error, error
    finally:
        context.close()

    release.touch()
    wait_until(lambda: trial(stack, added_id)["status"] == "SUCCEEDED", 60, "the added trial to succeed")
    assert trial(stack, added_id)["parameters"] == {**planned, "x": 9}
    # NNI's customized trial: no parameter id, its source "customized" in the record the trial reads
    record = json.loads(Path(f"{release}-9.cfg").read_text())
    assert (record["parameter_id"], record["parameter_source"]) == (None, "customized")
    assert json.loads(Path(f"{release}-1.cfg").read_text())["parameter_source"] == "algorithm"
    # its result reaches the tuner as NNI's customized trial: no parameter id, marked customized
    received = wait_until(lambda: journal.exists() and len(journal.read_text().splitlines()) == 2, 30, "2 results")
    assert received
    results = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [None, {**planned, "x": 9}, 9, {"customized": True, "trial_job_id": added_id}] in results
    assert [0, planned, 1, {"customized": False, "trial_job_id": first_id}] in results

    # the trial's detail shows the typed parameters; the experiment is done and takes no more
    context, page = open_page(browser, stack, ana, f"/experiments/{experiment}#trial={added_id}")
    try:
        page.locator("#detail-parameters", has_text='"x": 9').wait_for()
        page.locator('#exp-status[data-status="DONE"]').wait_for()
        page.locator("#detail-close").click()
        page.locator("#add-trial").click()
        assert "DONE" in page.locator("#add-trial-note").inner_text()
    finally:
        context.close()


def test_the_logs_view_shows_the_dispatcher_s_and_the_tuner_s_lines_and_the_masked_config(
    stack: Stack, browser, tmp_path: Path
) -> None:
    config = {
        "experimentName": "logs",
        "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(tmp_path),
        "trialConcurrency": 1,
        "searchSpace": {"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}},
        "tuner": {"name": "Random"},
        "trainingService": {  # no OpenPAI adapter runs: the trials wait, the lines are there
            "platform": "openpai",
            "host": "pai.example.com",
            "username": "ana",
            "token": SECRET,
            "trialCpuNumber": 1,
            "trialGpuNumber": 0,
            "trialMemorySize": "1gb",
            "storageConfigName": "confignfs",
            "localStorageMountPoint": str(tmp_path),
            "containerStorageMountPoint": "/mnt/data",
        },
    }
    created = stack.rest("POST", "/experiments", json=config)
    assert created.status_code == 201, created.text
    experiment = created.json()["id"]
    token = stack.token
    context, page = open_page(browser, stack, token, f"/experiments/{experiment}?logs=1")
    try:
        page.locator("#logs-panel").wait_for()
        assert page.locator("#logs-toggle").get_attribute("aria-expanded") == "true"
        lines = page.locator('#logs-lines li[data-service="dispatcher"]')
        dispatcher = lines.filter(has_text=f"experiment {experiment} created")
        dispatcher.wait_for()
        page.locator('#logs-lines li[data-service="tuner"]', has_text=f"driving experiment {experiment}").wait_for()
        assert '"loguniform"' in page.locator("#logs-search-space").inner_text()
        shown = page.locator("#logs-config").text_content()
        assert SECRET not in shown and "**********" in shown
        assert SECRET not in page.content()
        # new lines follow: the experiment stopped, the dispatcher's line about it shows without a reload
        assert stack.rest("DELETE", f"/experiments/{experiment}").status_code == 200
        lines.filter(has_text=f"experiment {experiment} stopped").wait_for()
        # one service's lines only, as the URL says
        page.locator("#logs-service").select_option("tuner")
        assert "logs=tuner" in page.url
        assert dispatcher.is_hidden()
    finally:
        context.close()
    # the API answers the same lines; no line of another experiment, no secret
    lines = stack_webui_json(stack, f"/api/experiments/{experiment}/logs?lines=50")["lines"]
    assert any(line["service"] == "tuner" for line in lines) and all(SECRET not in line["message"] for line in lines)
    assert all(experiment in line["message"] or line["service"] == "tuner" for line in lines)


def stack_webui_json(stack: Stack, path: str):
    answer = httpx.get(f"{stack.webui}{path}", headers=stack.auth, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()
