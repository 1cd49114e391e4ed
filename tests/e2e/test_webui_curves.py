"""The all-curves chart and the compare view as a user sees them in a real headless Chromium:
the step filter ranks trials at a step (not as they end), two trials compared overlay their
curves with their parameters side by side, and the URL reproduces both on reload.

The trials are written into the KV bucket as the dispatcher keeps them and their intermediate
results into the METRICS stream as the gateway publishes them; the web UI service, NATS and
the browser are the real ones."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest

from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus
from tests.e2e.conftest import config
from tests.e2e.test_webui import login, page, row  # noqa: F401 - fixtures
from tests.fixtures.browser import browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from tests.fixtures.webui import put_metrics, put_states
from tests.unit.test_webui_intermediate import CURVES

EXPERIMENT = "curves01"
START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[Stack]:
    """A web UI over NATS holding four trials (maximize) whose ranking at step 1 is not their
    ranking at the end: A leads at step 1, D at the end."""
    root = tmp_path_factory.mktemp("webui-curves")
    server = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=server).start("webui")
    try:
        experiment = ExperimentState(
            id=EXPERIMENT, config=ExperimentConfig.model_validate(config(root)), start_time=START
        )
        trials = [
            TrialState(
                id=trial_id,
                experiment_id=EXPERIMENT,
                sequence_id=i,
                status=TrialStatus.SUCCEEDED,
                platform="local-gpu",
                parameters={"lr": round(0.1 * (i + 1), 1), "layers": 2},
                submit_time=START,
                start_time=START,
                end_time=START + timedelta(seconds=10 + i),
                final_metric=values[-1],
                intermediate_count=len(values),
            )
            for i, (trial_id, values) in enumerate(CURVES.items())
        ]
        put_states(server.url, [experiment, *trials])
        put_metrics(server.url, EXPERIMENT, CURVES)
        yield stack
    finally:
        stack.stop()
        server.stop()


def chart(tab, selector: str, key: str) -> list[str]:
    return [t for t in (tab.get_attribute(selector, f"data-{key}") or "").split(",") if t]


def test_the_step_filter_ranks_the_trials_at_that_step(ui: Stack, page) -> None:  # noqa: F811
    # Given the experiment's page: every trial's curve on one chart, the best by latest result first
    tab = page
    tab.goto(f"{ui.webui}/experiments/{EXPERIMENT}")
    tab.wait_for_function("() => document.querySelector('#all-curves').dataset.series?.split(',').length === 4")
    assert chart(tab, "#all-curves", "highlighted") == ["D", "B", "C", "A"]
    assert tab.evaluate("() => performance.getEntriesByName('trialbus:curves').length") == 1
    assert "best latest intermediate result (maximize)" in tab.text_content("#curves-rule")

    # When the user types step 1 and presses Enter
    tab.fill("#step-input", "1")
    tab.press("#step-input", "Enter")

    # Then the trials are ranked as they stood at step 1 (A was ahead), in a table and on the chart
    tab.wait_for_selector("#all-curves[data-step='1']")
    ranked = tab.eval_on_selector_all(
        "#step-ranking tbody tr", "rows => rows.map((r) => [r.dataset.rank, r.dataset.ranked, r.cells[2].textContent])"
    )
    assert ranked == [["1", "A", "0.9"], ["2", "C", "0.7"], ["3", "B", "0.5"], ["4", "D", "0.2"]]
    assert chart(tab, "#all-curves", "highlighted") == ["A", "C", "B", "D"]
    assert "Ahead at step 1" in tab.text_content("#step-ranking-title")
    assert parse_qs(urlsplit(tab.url).query)["step"] == ["1"]

    # and a reload (the link a colleague gets) shows the same ranking
    tab.reload()
    tab.wait_for_selector("#all-curves[data-step='1']")
    assert tab.eval_on_selector_all("#step-ranking tbody tr", "rows => rows.map((r) => r.dataset.ranked)") == [
        "A",
        "C",
        "B",
        "D",
    ]
    assert tab.input_value("#step-input") == "1"

    # and Clear goes back to the ranking by latest result
    tab.click("#step-clear")
    tab.wait_for_selector("#all-curves[data-step='']")
    assert tab.is_hidden("#step-ranking-wrap") and "step" not in parse_qs(urlsplit(tab.url).query)


def test_comparing_two_trials_overlays_their_curves_and_parameters(ui: Stack, page) -> None:  # noqa: F811
    tab = page
    tab.goto(f"{ui.webui}/experiments/{EXPERIMENT}")
    tab.wait_for_selector(row("B"))
    assert tab.is_disabled("#compare-open")

    # When the user checks rows A and B with the keyboard, and compares them
    for trial_id in ("A", "B"):
        tab.focus(f"{row(trial_id)} input.pick")
        tab.keyboard.press("Space")
    assert tab.text_content("#compare-open") == "Compare 2 selected"
    assert tab.is_hidden("#trial-detail"), "checking a row does not open its detail"
    tab.focus("#compare-open")
    tab.keyboard.press("Enter")

    # Then both curves are overlaid, one series a trial, and their parameters are side by side
    tab.wait_for_selector("#compare:not([hidden])")
    tab.wait_for_function("() => document.querySelector('#compare-chart').dataset.series === 'A,B'")
    assert tab.get_attribute("#compare-chart", "data-points") == "6"
    heads = tab.eval_on_selector_all(
        "#compare-table thead th[data-compared]", "ths => ths.map((t) => t.dataset.compared)"
    )
    assert heads == ["A", "B"]
    lr = "#compare-table tr[data-row='parameter:lr']"
    assert tab.eval_on_selector_all(f"{lr} td", "tds => tds.map((t) => t.textContent)") == ["0.1", "0.2"]
    assert "differs" in (tab.get_attribute(lr, "class") or "")
    assert "differs" not in (tab.get_attribute("#compare-table tr[data-row='parameter:layers']", "class") or "")
    finals = tab.eval_on_selector_all("#compare-table tr[data-row='final'] td", "tds => tds.map((t) => t.textContent)")
    assert finals == ["0.3", "0.8"]
    assert parse_qs(urlsplit(tab.url).query)["compare"] == ["A,B"]

    # and the link reproduces the comparison on reload, the rows still checked
    tab.reload()
    tab.wait_for_selector("#compare:not([hidden])")
    tab.wait_for_function("() => document.querySelector('#compare-chart').dataset.series === 'A,B'")
    tab.wait_for_selector(f"{row('A')} input.pick:checked")
    assert tab.is_checked(f"{row('B')} input.pick") and not tab.is_checked(f"{row('C')} input.pick")

    # and closing it takes it out of the URL
    tab.click("#compare-close")
    assert tab.is_hidden("#compare") and "compare" not in parse_qs(urlsplit(tab.url).query)
