"""The web UI as a user sees it: a real stack, a real headless Chromium (Debian's, driven by
playwright), pages that update live while they stay open."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus
from contracts.retries import Attempt
from tests.e2e.conftest import config
from tests.e2e.helpers import create, ended, submit, trial
from tests.fixtures.browser import WAIT_MS, browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.stack import Stack
from tests.fixtures.webui import put_states

PASSWORD = "ssh-pw-never-in-the-page-4b7e"
PAI_TOKEN = "pai-token-never-in-the-page-c21d"


@pytest.fixture
def page(browser, request):
    """A fresh browser context and page, logged in to the test's ``ui`` once as a user does
    (the link `trialbus up` prints); a script error in the page fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    if "ui" in request.fixturenames:
        login(page, request.getfixturevalue("ui"))
    yield page
    context.close()
    if errors:
        pytest.fail(f"the page raised: {errors}")


def login(page, ui: Stack) -> None:
    answer = page.goto(f"{ui.webui}/login?token={ui.token}")
    assert answer is not None and answer.ok, "the login link opens the web UI"


@pytest.fixture
def ui(stack: Stack) -> Stack:
    """The conftest's stack (dispatcher, gateway, local adapter) plus the web UI."""
    return stack.start("webui")


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("TRIALBUS_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def row(trial_id: str, status: str | None = None) -> str:
    return f"tr[data-trial-id='{trial_id}']" + (f"[data-status='{status}']" if status else "")


def applied_ms(page) -> float:
    """How long the page took to apply its latest batch of events (its own measure)."""
    return page.evaluate("() => performance.getEntriesByName('trialbus:apply').at(-1)?.duration ?? -1")


def points(page, selector: str) -> int:
    return int(page.get_attribute(selector, "data-points") or 0)


def test_root_shows_the_newest_experiment_and_follows_new_ones_live(ui: Stack, page, code_dir: Path) -> None:
    page.goto(ui.webui + "/")
    page.wait_for_selector("#empty:not([hidden])")
    assert "No experiments yet" in page.text_content("#empty")
    page.evaluate("() => { window.loadedOnce = true; }")

    first = create(ui, config(code_dir, experimentName="first"))
    page.wait_for_function("id => document.querySelector('#exp-id').textContent === id", arg=first)
    second = create(ui, config(code_dir, experimentName="second"))
    page.wait_for_function("id => document.querySelector('#exp-id').textContent === id", arg=second)
    assert page.text_content("#exp-name") == "second"
    assert page.evaluate("() => window.loadedOnce") is True, "the page followed without a reload"

    page.goto(f"{ui.webui}/experiments/{first}")
    page.wait_for_function("id => document.querySelector('#exp-id').textContent === id", arg=first)
    missing = page.goto(f"{ui.webui}/experiments/nosuch99")
    assert missing.status == 404 and "nosuch99" in page.text_content("#message")


def test_trials_appear_live_and_a_curve_grows_as_metrics_arrive(ui: Stack, page, code_dir: Path) -> None:
    experiment = create(ui, config(code_dir))
    page.goto(f"{ui.webui}/experiments/{experiment}")
    page.wait_for_selector("#connection[data-state='live']")
    page.evaluate("() => { window.loadedOnce = true; }")

    quick = submit(ui, experiment, {"x": 0.25})
    page.wait_for_selector(row(quick))
    slow = submit(ui, experiment, {"x": 0.5, "intermediate": 8, "pause": 0.4, "opt": {"_name": "adam", "lr": 0.01}})
    page.wait_for_selector(row(slow))
    assert "adam(lr=0.01)" in page.text_content(row(slow)), "a nested choice reads as name(args)"
    assert page.locator("#trials tbody tr").count() == 2, "new parameter columns rebuild rows, never duplicate them"
    assert page.locator("#trials th[data-column='parameter:opt']").count() == 1

    page.click(row(slow))
    page.wait_for_function("() => document.querySelector('#trial-curve').dataset.points > 0")
    seen = points(page, "#trial-curve")
    page.wait_for_function("n => document.querySelector('#trial-curve').dataset.points > n", arg=seen)
    page.wait_for_selector(row(slow, "SUCCEEDED"))
    page.wait_for_function("() => document.querySelector('#trial-curve').dataset.points == 8")
    assert page.text_content("#detail-status") == "SUCCEEDED"
    assert "0.5" in page.text_content("#detail-final")
    assert "local-gpu @ test-host" in page.text_content("#detail-platform")
    page.wait_for_function("() => !document.querySelector('#detail-log').textContent.startsWith('(')")

    page.wait_for_selector(row(quick, "SUCCEEDED"))
    # maximize, NNI's default: the higher final is the best
    page.wait_for_function("() => document.querySelector('#exp-best').dataset.value === '0.5'")
    page.wait_for_function("() => document.querySelector('#overview-chart').dataset.points == 2")
    assert page.text_content("#exp-counts li[data-status='SUCCEEDED'] b") == "2"
    page.wait_for_selector("#platforms article[data-adapter='local-gpu']")
    assert page.evaluate("() => window.loadedOnce") is True, "everything arrived without a reload"


def test_cancel_a_running_trial_from_its_row(ui: Stack, page, code_dir: Path) -> None:
    experiment = create(ui, config(code_dir))
    running = submit(ui, experiment, {"x": 1, "sleep": 60})
    page.goto(f"{ui.webui}/experiments/{experiment}")
    page.wait_for_selector(row(running, "RUNNING"))

    page.click(f"{row(running)} button.cancel")

    page.wait_for_selector(row(running, "USER_CANCELED"))
    assert trial(ui, running)["status"] == "USER_CANCELED"
    assert page.locator(f"{row(running)} button.cancel").count() == 0, "an ended trial offers no cancel"


def test_stop_the_experiment_after_confirming(ui: Stack, page, code_dir: Path) -> None:
    experiment = create(ui, config(code_dir, trialConcurrency=1))
    running = submit(ui, experiment, {"x": 1, "sleep": 60})
    queued = submit(ui, experiment, {"x": 2})
    page.goto(f"{ui.webui}/experiments/{experiment}")
    page.wait_for_selector(row(running, "RUNNING"))

    page.click("#stop-experiment")
    page.wait_for_selector("#confirm-stop[open]")
    page.click("#confirm-stop-no")  # changed their mind
    page.wait_for_selector("#confirm-stop", state="hidden")
    time.sleep(0.3)
    assert ui.rest("GET", f"/experiments/{experiment}").json()["status"] == "RUNNING"

    page.click("#stop-experiment")
    page.click("#confirm-stop-yes")

    page.wait_for_function("() => document.querySelector('#exp-status').textContent === 'STOPPED'")
    assert ui.rest("GET", f"/experiments/{experiment}").json()["status"] == "STOPPED"
    page.wait_for_selector(row(running, "USER_CANCELED"))
    page.wait_for_selector(row(queued, "USER_CANCELED"))
    assert page.is_disabled("#stop-experiment")


#: A trial that fails on its first attempt and succeeds on the next: each attempt reports
#: ``points[attempt]`` intermediate results (10 × attempt + i), from sequence 0 again.
RETRIED_TRIAL = """
import os, sys
import nni

params = nni.get_next_parameter()
attempt = int(os.environ["TRIALBUS_ATTEMPT"])
for i in range(params["points"][attempt]):
    nni.report_intermediate_result(10 * attempt + i)
if attempt == 0:
    print("attempt 0 gives up", file=sys.stderr, flush=True)
    sys.exit(3)
nni.report_final_result(10 * attempt + 0.5)
"""


def retried_config(code_dir: Path, **overrides) -> dict:
    (code_dir / "retried.py").write_text(RETRIED_TRIAL)
    return config(code_dir, trialCommand=f"{sys.executable} retried.py", **overrides)


def attempt_cell(page, attempt: int, field: str) -> str:
    return page.text_content(f"#detail-attempts tbody[data-attempt='{attempt}'] td[data-field='{field}']")


def test_a_retried_trial_shows_its_attempts_and_the_curve_of_the_current_one(ui: Stack, page, code_dir: Path) -> None:
    # Given an experiment that retries its trials' own failures once, at once
    experiment = create(ui, retried_config(code_dir, retry={"trial": 1, "backoff": "0s"}))
    page.goto(f"{ui.webui}/experiments/{experiment}")
    page.wait_for_selector("#connection[data-state='live']")

    # When a trial reports 4 results and fails, then reports 2 from 0 again and succeeds
    retried = submit(ui, experiment, {"points": [4, 2]})
    assert ended(ui, retried)["status"] == "SUCCEEDED"

    # Then its row says it ran twice, and its panel shows attempt 1 and the failed attempt 0
    page.wait_for_selector(f"{row(retried, 'SUCCEEDED')} td[data-column='status']:text-is('SUCCEEDED ×2')")
    page.click(row(retried))
    page.wait_for_selector("#detail-attempts:not([hidden])")
    assert page.text_content("#detail-status") == "SUCCEEDED"
    assert page.is_visible("#detail-attempt") and page.text_content("#detail-attempt") == "1"
    assert page.locator("#detail-attempts tbody").count() == 1
    assert attempt_cell(page, 0, "status") == "FAILED"
    assert attempt_cell(page, 0, "failure") == "trial"
    assert attempt_cell(page, 0, "exitCode") == "3"
    assert attempt_cell(page, 0, "platform") == "local-gpu @ test-host"
    assert "10.5" in page.text_content("#detail-final")
    # and its curve is the second attempt's 2 results, the first attempt's 4 drawn apart (not merged)
    page.wait_for_function("() => document.querySelector('#trial-curve').dataset.lines === '2'")
    assert points(page, "#trial-curve") == 2
    assert page.get_attribute("#trial-curve", "data-attempt") == "1"
    assert page.is_visible("#detail-retry") and page.is_hidden("#detail-cancel"), "an ended trial: retry, no cancel"
    # and its log is the current attempt's, while attempt 0's is a click away, then back
    page.wait_for_selector("#detail-log[data-attempt='']")
    assert "attempt 0 gives up" not in page.text_content("#detail-log") and page.is_hidden("#log-current")
    page.click("#detail-attempts tbody[data-attempt='0'] button.log")
    page.wait_for_function("() => document.querySelector('#detail-log').textContent.includes('attempt 0 gives up')")
    assert page.get_attribute("#detail-log", "data-attempt") == "0"
    assert page.text_content("#detail-log-of") == "of attempt 0" and page.is_visible("#log-current")
    page.screenshot(path=str(artifacts(code_dir.parent) / "webui-retried-trial.png"))
    page.click("#log-current")
    page.wait_for_function(
        "() => !document.querySelector('#detail-log').textContent.includes('attempt 0 gives up')"
        " && document.querySelector('#detail-log').textContent !== ''"
    )
    assert page.get_attribute("#detail-log", "data-attempt") == "" and page.is_hidden("#log-current")


def test_retry_a_failed_trial_from_its_panel(ui: Stack, page, code_dir: Path) -> None:
    # Given a trial that failed, in an experiment with no retry policy (its own failures end it)
    experiment = create(ui, retried_config(code_dir))
    failed = submit(ui, experiment, {"points": [1, 3]})
    assert ended(ui, failed)["status"] == "FAILED"
    page.goto(f"{ui.webui}/experiments/{experiment}#trial={failed}")
    page.wait_for_selector(row(failed, "FAILED"))
    page.wait_for_function("id => document.querySelector('#trial-detail').dataset.trialId === id", arg=failed)
    assert page.is_hidden("#detail-attempt-fact") and page.is_hidden("#detail-attempts")
    assert page.text_content("#detail-failure") == "trial"

    # When the user clicks Retry
    page.click("#detail-retry")

    # Then it runs again and succeeds as attempt 1, its first attempt listed below
    page.wait_for_function("() => document.querySelector('#detail-status').textContent === 'SUCCEEDED'")
    assert page.text_content("#detail-attempt") == "1"
    assert attempt_cell(page, 0, "status") == "FAILED" and attempt_cell(page, 0, "exitCode") == "3"
    page.wait_for_function("() => document.querySelector('#trial-curve').dataset.points === '3'")
    assert page.get_attribute("#trial-curve", "data-attempt") == "1"
    page.wait_for_selector(f"{row(failed, 'SUCCEEDED')} td[data-column='status']:text-is('SUCCEEDED ×2')")
    shown = trial(ui, failed)
    assert (shown["status"], shown["attempt"], [a["status"] for a in shown["attempts"]]) == ("SUCCEEDED", 1, ["FAILED"])

    # and once the experiment is stopped, its trials can no longer be retried from the page
    assert page.is_enabled("#detail-retry")
    assert ui.rest("DELETE", f"/experiments/{experiment}").status_code == 200
    page.wait_for_function("() => document.querySelector('#detail-retry').disabled")
    assert "resume" in page.get_attribute("#detail-retry", "title")


def test_the_summary_says_why_trials_failed_as_text_and_why_the_experiment_stopped(
    ui: Stack, page, code_dir: Path
) -> None:
    # Given an experiment on the page whose trials fail alike, printing markup as their last stderr line
    line = "<img src=x onerror=alert(1)>ImportError: <b>no</b> module named x"
    experiment = create(ui, config(code_dir, trialConcurrency=1, maxTrialNumber=10))
    page.goto(f"{ui.webui}/experiments/{experiment}")
    page.wait_for_function("id => document.querySelector('#exp-id').textContent === id", arg=experiment)
    failed = [ended(ui, submit(ui, experiment, {"x": n, "exit": 1, "stderr": line}))["id"] for n in range(3)]

    # Then the summary shows the first failure's line, as text, with the command for its log, and the stop
    item = f"#exp-failures li[data-trial='{failed[0]}']"
    page.wait_for_selector(item)
    assert page.text_content(f"{item} .last-error") == line
    assert page.locator("#exp-failures img, #exp-failures b").count() == 0
    shown = page.text_content(item)
    assert "failed (exit 1)" in shown and f"trialbus log trial {failed[0]}" in shown
    assert page.locator("#exp-failures li").count() == 1  # one per distinct line
    page.wait_for_function("() => document.querySelector('#exp-status').textContent === 'STOPPED'")
    assert "failFast: its first 3 trials failed the same way" in page.text_content("#exp-message")


def test_secrets_in_a_config_never_reach_the_page(ui: Stack, page, code_dir: Path) -> None:
    # No remote or openpai adapter runs: the dispatcher takes the experiments (trials would wait).
    remote = create(
        ui,
        config(
            code_dir,
            trainingService={
                "platform": "remote",
                "machineList": [{"host": "10.9.8.7", "user": "bob", "password": PASSWORD}],
            },
        ),
    )
    openpai = create(
        ui,
        config(
            code_dir,
            trialGpuNumber=0,
            trainingService={
                "platform": "openpai",
                "host": "pai.example.com",
                "username": "alice",
                "token": PAI_TOKEN,
                "trialCpuNumber": 1,
                "trialMemorySize": "1gb",
                "storageConfigName": "nfs",
                "localStorageMountPoint": str(code_dir),
                "containerStorageMountPoint": "/mnt/share",
            },
        ),
    )
    for experiment, secret in ((remote, PASSWORD), (openpai, PAI_TOKEN)):
        page.goto(f"{ui.webui}/experiments/{experiment}")
        page.wait_for_function("id => document.querySelector('#exp-id').textContent === id", arg=experiment)
        page.click("#overview summary")
        shown = page.text_content("#exp-config")
        assert "**********" in shown and ("10.9.8.7" in shown or "pai.example.com" in shown)
        assert secret not in page.content()
        shown = httpx.get(f"{ui.webui}/api/experiments/{experiment}", headers=ui.auth)
        assert shown.status_code == 200 and secret not in shown.text


def thousand_trials(experiment_id: str, start: datetime) -> list[TrialState]:
    statuses = [TrialStatus.SUCCEEDED, TrialStatus.RUNNING, TrialStatus.WAITING, TrialStatus.FAILED]
    trials = []
    for i in range(1000):
        status = statuses[i % 4]
        ended = status in (TrialStatus.SUCCEEDED, TrialStatus.FAILED)
        trials.append(
            TrialState(
                id=f"T{i:04d}",
                experiment_id=experiment_id,
                sequence_id=i,
                status=status,
                platform="local-gpu",
                parameters={
                    "lr": 10 ** -(1 + i % 5),
                    "batch": 16 * (1 + i % 4),
                    "optimizer": {"_name": "sgd", "momentum": round(i % 10 / 10, 1)},
                },
                submit_time=start,
                start_time=start if status != TrialStatus.WAITING else None,
                end_time=start + timedelta(seconds=i) if ended else None,
                final_metric=({"default": (i % 97) / 100} if i % 2 else (i % 89) / 100)
                if status == TrialStatus.SUCCEEDED
                else None,
                intermediate_count=i % 20,
                replica="test-host" if status != TrialStatus.WAITING else None,
                # every 7th trial is on its second attempt, the first one failed
                attempt=1 if i % 7 == 0 else 0,
                attempts=[
                    Attempt(
                        attempt=0,
                        platform="local-gpu",
                        replica="test-host",
                        start_time=start,
                        end_time=start,
                        status="FAILED",
                        exit_code=1,
                        failure="trial",
                        message="trial command exited with code 1",
                    )
                ]
                if i % 7 == 0
                else [],
            )
        )
    return trials


def test_a_thousand_trials_render_and_stay_live(nats_server, tmp_path: Path, page) -> None:
    # Given an experiment with 1,000 trials as the dispatcher keeps them (no processes needed)
    ui = Stack(root=tmp_path, nats=nats_server).start("webui")
    login(page, ui)
    try:
        start = datetime(2020, 1, 1, tzinfo=UTC)
        config_ = ExperimentConfig.model_validate(config(tmp_path))
        trials = thousand_trials("big00001", start)
        put_states(nats_server.url, [ExperimentState(id="big00001", config=config_, start_time=start), *trials])

        # When the page opens, it shows the rows on screen of the 1,000 (the table is virtualised)
        began = time.perf_counter()
        page.goto(f"{ui.webui}/experiments/big00001")
        page.wait_for_selector(row("T0000"))
        first_render, first_apply = time.perf_counter() - began, applied_ms(page)
        finals = sum(1 for t in trials if t.final_metric is not None)
        assert page.text_content("#exp-trial-count") == "1000" and page.get_attribute("#trials", "data-total") == "1000"
        assert 10 < page.locator("#trials tbody tr").count() < 200, "only a window of rows is in the DOM"
        page.wait_for_function("n => document.querySelector('#overview-chart').dataset.points == n", arg=finals)
        assert page.text_content("#exp-counts li[data-status='RUNNING'] b") == "250"
        assert page.text_content(f"{row('T0007')} td[data-column='status']") == "FAILED ×2", "a retried trial"
        assert page.text_content(f"{row('T0006')} td[data-column='status']") == "WAITING"
        # and scrolled to it, a row far down
        page.evaluate("() => document.querySelector('.table-wrap').scrollTop = 501 * 27 - 100")
        page.wait_for_selector(row("T0501"))

        # and a status change arrives while the page stays open
        changed = trials[501].model_copy(
            update={"status": TrialStatus.SUCCEEDED, "final_metric": 5.0, "end_time": start + timedelta(hours=1)}
        )
        began = time.perf_counter()
        put_states(nats_server.url, [changed])
        page.wait_for_selector(row("T0501", "SUCCEEDED"))
        one_update, update_apply = time.perf_counter() - began, applied_ms(page)
        page.wait_for_function("() => document.querySelector('#exp-best').dataset.value === '5'")

        # and so does a burst: every running trial ends at once
        burst = [
            t.model_copy(update={"status": TrialStatus.FAILED, "end_time": start + timedelta(hours=2)})
            for t in trials
            if t.status == TrialStatus.RUNNING and t.id != "T0501"
        ]
        began = time.perf_counter()
        put_states(nats_server.url, burst)
        page.wait_for_function("() => !document.querySelector('#trials tr[data-status=\"RUNNING\"]')")
        burst_update, burst_apply = time.perf_counter() - began, applied_ms(page)

        # and sorting and filtering the full table respond (on the server)
        began = time.perf_counter()
        page.click("#trials th[data-column='default']")  # the best first
        page.wait_for_function(
            "() => document.querySelector('#trials tbody tr[data-position=\"0\"]')?.dataset.trialId === 'T0501'"
        )
        sort_time = time.perf_counter() - began
        page.select_option("#status-filter", "WAITING")
        page.wait_for_function(
            "() => document.querySelector('#trials').dataset.total === '250'"
            " && document.querySelector('#trials tbody tr[data-position=\"0\"]')"
            "?.dataset.status === 'WAITING'"
        )
        assert set(page.eval_on_selector_all("#trials tbody tr", "rows => rows.map(r => r.dataset.status)")) == {
            "WAITING"
        }
        page.screenshot(path=str(artifacts(tmp_path) / "webui-1000-trials.png"))
        print(
            f"\n1,000 trials (wall clock from the test, and the page's own time to apply the events):\n"
            f"  first render {first_render * 1000:.0f} ms (apply {first_apply:.0f} ms)\n"
            f"  one status change {one_update * 1000:.0f} ms (apply {update_apply:.0f} ms)\n"
            f"  {len(burst)} changes at once {burst_update * 1000:.0f} ms (apply {burst_apply:.0f} ms)\n"
            f"  sort by metric {sort_time * 1000:.0f} ms",
            file=sys.stderr,
        )
    finally:
        ui.stop()
