"""The experiment page's analysis as a user meets it in a real headless Chromium: the
hyper-parameters' parallel coordinates filtered to the top 20 % (nested choices as axes), the
trials' durations as a histogram, and the top trials table (docs/webui.md).

The trials are written into the KV bucket as the dispatcher keeps them (no trial processes:
the views read only their states); the web UI service, NATS and the browser are the real ones."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus
from tests.e2e.conftest import config
from tests.e2e.test_webui import artifacts, login, page  # noqa: F401 - fixtures
from tests.fixtures.browser import browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from tests.fixtures.webui import put_states

EXPERIMENT = "hparams01"
TRIALS = 40
START = datetime(2020, 1, 1, tzinfo=UTC)
SPACE = {
    "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
    "batch": {"_type": "choice", "_value": [16, 32, 64]},
    "optimizer": {
        "_type": "choice",
        "_value": [
            {"_name": "sgd", "momentum": {"_type": "uniform", "_value": [0, 1]}},
            {"_name": "adam", "lr": {"_type": "loguniform", "_value": [1e-4, 1e-2]}},
        ],
    },
}


def metric(i: int) -> float | None:
    """Distinct losses (minimize), none for every fourth trial (it failed)."""
    return None if i % 4 == 3 else round(((i * 17) % 41) / 10, 1)


def seconds(i: int) -> int:
    """Trial i's duration: 10 s for the first half, 100 s for the rest (two bars)."""
    return 10 if i < TRIALS // 2 else 100


def states(root: Path) -> list:
    minimize = {"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}
    experiment = ExperimentState(
        id=EXPERIMENT,
        config=ExperimentConfig.model_validate(config(root, searchSpace=SPACE, tuner=minimize)),
        start_time=START,
    )
    trials = []
    for i in range(TRIALS):
        optimizer = {"_name": "sgd", "momentum": i / TRIALS} if i % 2 else {"_name": "adam", "lr": 10 ** -(2 + i % 3)}
        trials.append(
            TrialState(
                id=f"H{i:03d}",
                experiment_id=EXPERIMENT,
                sequence_id=i,
                status=TrialStatus.FAILED if metric(i) is None else TrialStatus.SUCCEEDED,
                platform="local-gpu",
                parameters={"lr": 10 ** -(1 + i % 4), "batch": [16, 32, 64][i % 3], "optimizer": optimizer},
                submit_time=START,
                start_time=START,
                end_time=START + timedelta(seconds=seconds(i)),
                final_metric=metric(i),
            )
        )
    return [experiment, *trials]


def ranked() -> list[str]:
    """Trial ids with a metric, the best (lowest) first, ties to the earlier trial."""
    return [
        f"H{i:03d}" for i in sorted((i for i in range(TRIALS) if metric(i) is not None), key=lambda i: (metric(i), i))
    ]


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("webui-hparams")
    server = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=server).start("webui")
    try:
        put_states(server.url, states(root))
        yield stack
    finally:
        stack.stop()
        server.stop()


def opened(ui: Stack, tab, query: str = "") -> None:
    login(tab, ui)
    tab.goto(f"{ui.webui}/experiments/{EXPERIMENT}{query}")
    tab.wait_for_function("n => document.querySelector('#exp-trial-count')?.textContent === String(n)", arg=TRIALS)


def lines(tab) -> list[str]:
    return tab.eval_on_selector_all("#hp-chart path.line", "ps => ps.map((p) => p.dataset.trialId)")


def test_the_parallel_coordinates_filter_to_the_top_20_percent_with_nested_axes(
    ui: Stack,
    page,  # noqa: F811 - the page fixture of test_webui
    tmp_path: Path,
) -> None:
    tab = page
    best = ranked()
    opened(ui, tab)
    tab.wait_for_function("n => document.querySelector('#hp-chart').dataset.lines === String(n)", arg=len(best))
    assert sorted(lines(tab)) == sorted(best), "every trial with a final metric, one line each"
    assert tab.evaluate("() => performance.getEntriesByName('trialbus:hparams').length") == 1

    # The nested choice is flattened to axes, the final metric last
    axes = tab.eval_on_selector_all("#hp-chart g.axis", "gs => gs.map((g) => g.dataset.axis)")
    assert axes == ["lr", "batch", "optimizer/_name", "optimizer/momentum", "optimizer/lr", "final metric"]
    assert tab.locator("#hp-chart g.axis[data-axis='optimizer/momentum'] text.absent").count() == 1
    tab.locator("#analysis").screenshot(path=str(artifacts(tmp_path) / "webui-hparams.png"))

    # When the user shows the top 20 %
    tab.select_option("#hp-top", "20")

    # Then exactly the best fifth (minimize: the lowest losses) is drawn, and listed best first
    top = best[: math.ceil(len(best) * 20 / 100)]
    tab.wait_for_function("n => document.querySelector('#hp-chart').dataset.lines === String(n)", arg=len(top))
    assert sorted(lines(tab)) == sorted(top)
    assert "top 20 %" in tab.text_content("#hp-rule")
    tab.click("#hp-table-details summary")  # (its table is drawn on the toggle event, which comes after the click)
    tab.wait_for_function("n => document.querySelectorAll('#hp-table tbody tr').length === n", arg=len(top))
    listed = tab.eval_on_selector_all("#hp-table tbody tr", "rs => rs.map((r) => r.dataset.lineTrial)")
    assert listed == top
    assert "top=20" in tab.url

    # and the link keeps the view: a colleague opening it sees the same lines
    tab.goto(tab.url)
    tab.wait_for_function("n => document.querySelector('#hp-chart').dataset.lines === String(n)", arg=len(top))
    assert sorted(lines(tab)) == sorted(top) and tab.input_value("#hp-top") == "20"

    # and an axis moves with the keyboard (its order in the URL too)
    tab.focus("#hp-chart g.axis[data-axis='batch'] text.name")
    tab.keyboard.press("ArrowLeft")
    tab.wait_for_function("() => document.querySelector('#hp-chart').dataset.axes.startsWith('batch|lr|')")
    assert "axes=batch" in tab.url


def test_durations_and_the_top_trials_table(ui: Stack, page, tmp_path: Path) -> None:  # noqa: F811
    tab = page
    opened(ui, tab, "?best=5")

    # The top trials table lists the best five, in order, each a link to its detail
    best = ranked()[:5]
    tab.wait_for_function("n => document.querySelectorAll('#top-trials tbody tr').length === n", arg=len(best))
    assert tab.eval_on_selector_all("#top-trials tbody tr", "rs => rs.map((r) => r.dataset.topTrial)") == best
    tab.locator("#top-trials-panel").screenshot(path=str(artifacts(tmp_path) / "webui-top-trials.png"))
    tab.click(f"#top-trials tr[data-top-trial='{best[0]}'] a")
    tab.wait_for_function("id => document.querySelector('#detail-title').textContent.includes(id)", arg=best[0])
    tab.click("#detail-close")

    # When the user opens the Durations tab with the keyboard
    tab.focus("#tab-hparams")
    tab.keyboard.press("ArrowRight")

    # Then the histogram counts every ended trial: half took 10 s, half 100 s
    tab.wait_for_function("n => document.querySelector('#dur-chart').dataset.count === String(n)", arg=TRIALS)
    assert tab.get_attribute("#tab-durations", "aria-selected") == "true"
    counts = tab.eval_on_selector_all("#dur-table tbody tr", "rs => rs.map((r) => Number(r.dataset.count))")
    assert sum(counts) == TRIALS and counts[0] == TRIALS // 2 and counts[-1] == TRIALS // 2
    assert tab.locator("#dur-chart rect.bar").count() == len(counts)
    assert "analysis=durations" in tab.url
    tab.locator("#analysis").screenshot(path=str(artifacts(tmp_path) / "webui-durations.png"))
