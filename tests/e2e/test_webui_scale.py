"""The web UI at a few thousand trials, as a user sees it in a real headless Chromium: the table
is virtualised (a window of rows in the DOM), sorts and filters on the server, scrolls to its
last row, pages through every trial once, and a trial's long curve is drawn cut down to the
chart with its extremes kept.

The trials are written into the KV bucket as the dispatcher keeps them, and the curve's records
into the METRICS stream as the gateway publishes them (no trial processes: thousands of them
would take minutes); the web UI service, NATS and the browser are the real ones."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest

from contracts import ExperimentConfig, ExperimentState, MetricRecord, MetricType, TrialState, TrialStatus, subjects
from tests.e2e.conftest import config
from tests.e2e.test_webui import artifacts, login, page, row  # noqa: F401 - fixtures
from tests.fixtures.browser import browser_fixture  # noqa: F401 - fixture: browser
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from tests.fixtures.webui import put_states

TRIALS = 3000
EXPERIMENT = "scale001"
CURVE_POINTS = 5000
SPIKE = (2345, 1000.0)  # one intermediate result far above the others: the chart must keep it
START = datetime(2020, 1, 1, tzinfo=UTC)
STATUSES = [
    TrialStatus.SUCCEEDED,
    TrialStatus.SUCCEEDED,
    TrialStatus.FAILED,
    TrialStatus.RUNNING,
    TrialStatus.SUCCEEDED,
    TrialStatus.WAITING,
    TrialStatus.USER_CANCELED,
]
#: Rows the DOM may hold at once: a window of what is on screen, not the table.
MAX_DOM_ROWS = 200


def metric(i: int) -> float | None:
    """Trial i's final metric: distinct values spread over the trials (None unless it succeeded)."""
    return ((i * 7919) % TRIALS) / 10 if STATUSES[i % len(STATUSES)] == TrialStatus.SUCCEEDED else None


def trials() -> list[TrialState]:
    found = []
    for i in range(TRIALS):
        status = STATUSES[i % len(STATUSES)]
        ended = status not in (TrialStatus.WAITING, TrialStatus.RUNNING)
        found.append(
            TrialState(
                id=f"S{i:05d}",
                experiment_id=EXPERIMENT,
                sequence_id=i,
                status=status,
                platform="local-gpu",
                parameters={"lr": 10 ** -(1 + i % 4), "layers": 1 + i % 6},
                submit_time=START,
                start_time=START if status != TrialStatus.WAITING else None,
                end_time=START + timedelta(seconds=i) if ended else None,
                final_metric=metric(i),
                intermediate_count=CURVE_POINTS if i == 0 else 0,
            )
        )
    return found


def publish_curve(url: str, trial_id: str) -> None:
    """CURVE_POINTS intermediate results of the trial, one record a message, as the gateway
    publishes them (with their ``Nats-Msg-Id``); from another thread (playwright owns this one's loop)."""

    async def publish() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            subject = subjects.metrics(EXPERIMENT, trial_id)

            def record(sequence: int) -> MetricRecord:
                value = SPIKE[1] if sequence == SPIKE[0] else (sequence % 100) / 100
                return MetricRecord(
                    experiment_id=EXPERIMENT,
                    trial_id=trial_id,
                    type=MetricType.PERIODICAL,
                    sequence=sequence,
                    value=json.dumps(value),
                    timestamp=START,
                )

            for start in range(0, CURVE_POINTS, 500):
                await asyncio.gather(
                    *(
                        js.publish(
                            subject,
                            record(s).encode(),
                            headers={"Nats-Msg-Id": subjects.metric_id(trial_id, "PERIODICAL", s, 0)},
                        )
                        for s in range(start, min(CURVE_POINTS, start + 500))
                    )
                )
        finally:
            await nc.drain()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, publish()).result()


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Iterator[Stack]:
    """One web UI over NATS holding an experiment of TRIALS trials (made once for this module)."""
    root = tmp_path_factory.mktemp("webui-scale")
    server = NatsServer(root / "jetstream").start()
    ui = Stack(root=root, nats=server).start("webui")
    try:
        experiment = ExperimentState(
            id=EXPERIMENT, config=ExperimentConfig.model_validate(config(root)), start_time=START
        )
        began = time.perf_counter()
        put_states(server.url, [experiment, *trials()])
        publish_curve(server.url, "S00000")
        print(
            f"\n{TRIALS:,} trials and {CURVE_POINTS:,} records written in {time.perf_counter() - began:.1f} s",
            file=sys.stderr,
        )
        yield ui
    finally:
        ui.stop()
        server.stop()


@pytest.fixture
def opened(big: Stack, page):  # noqa: F811 - the page fixture of test_webui
    """The experiment's page, logged in, its table drawn."""
    tab = page
    login(tab, big)
    tab.set_viewport_size({"width": 1400, "height": 1400})
    tab.goto(f"{big.webui}/experiments/{EXPERIMENT}")
    tab.wait_for_function("n => document.querySelector('#trials').dataset.total === String(n)", arg=TRIALS)
    tab.wait_for_selector(row("S00000"))
    return tab


def dom_rows(tab) -> int:
    return tab.locator("#trials tbody tr").count()


def on_screen(tab) -> list[tuple[int, str, str]]:
    """(position, trial id, default metric text) of every row the table's scroll box shows."""
    return tab.evaluate("""() => {
        const box = document.querySelector('.table-wrap').getBoundingClientRect();
        const head = document.querySelector('#trials thead').getBoundingClientRect();
        return [...document.querySelectorAll('#trials tbody tr')].filter((r) => {
            const b = r.getBoundingClientRect();
            return b.top >= head.bottom - 1 && b.bottom <= box.bottom + 1;
        }).map((r) => [Number(r.dataset.position), r.dataset.trialId,
                       r.querySelector("td[data-column='default']").textContent]);
    }""")


def scroll_to(tab, position: int) -> None:
    tab.evaluate("p => { document.querySelector('.table-wrap').scrollTop = p * 27; }", position)


def test_the_page_opens_with_a_window_of_rows_and_scrolls_to_the_last(opened) -> None:
    # Given the tab open on 3,000 trials: only the rows on screen are in the DOM
    tab = opened
    timing = tab.evaluate("() => performance.getEntriesByName('trialbus:rows')[0]?.startTime ?? -1")
    assert 0 < dom_rows(tab) < MAX_DOM_ROWS, "a window of rows, not the table"
    assert tab.text_content("#shown-count") == f"{TRIALS} trials"

    # When the user scrolls to the bottom
    tab.evaluate("() => { const w = document.querySelector('.table-wrap'); w.scrollTop = w.scrollHeight; }")

    # Then the last trial's row is shown, and the DOM still holds a window
    tab.wait_for_selector(row(f"S{TRIALS - 1:05d}"))
    assert tab.get_attribute(row(f"S{TRIALS - 1:05d}"), "data-position") == str(TRIALS - 1)
    assert on_screen(tab)[-1][1] == f"S{TRIALS - 1:05d}", "the last row is on screen, not past it"
    assert 0 < dom_rows(tab) < MAX_DOM_ROWS
    heap = tab.evaluate("() => performance.memory?.usedJSHeapSize ?? 0") / 2**20
    print(f"\nfirst rows drawn {timing:.0f} ms after navigation start; JS heap {heap:.1f} MiB", file=sys.stderr)


def test_sorted_best_first_on_the_server_and_paged_through_every_trial_once(opened) -> None:
    tab = opened
    finals = sorted((metric(i) for i in range(TRIALS) if metric(i) is not None), reverse=True)

    # When the user sorts by the default metric (maximize: the highest first)
    tab.click("#trials th[data-column='default']")
    tab.wait_for_function("() => document.querySelector('#trials').dataset.sort === 'metric'")
    tab.wait_for_function(
        "v => document.querySelector(\"#trials tbody tr[data-position='0'] "
        "td[data-column='default']\")?.textContent === v",
        arg=str(finals[0]),
    )
    assert tab.get_attribute("#trials th[data-column='default']", "aria-sort") == "ascending"

    # and pages down through the whole table a screen at a time
    seen: dict[int, tuple[str, str]] = {}
    position = 0
    began = time.perf_counter()
    while position < TRIALS:
        scroll_to(tab, position)
        tab.wait_for_function(
            "p => [...document.querySelectorAll('#trials tbody tr')].some((r) => r.dataset.position === String(p))",
            arg=position,
        )
        shown = [r for r in on_screen(tab) if r[0] >= position]
        assert shown and shown[0][0] == position, "the screen starts at the row scrolled to"
        seen.update({p: (trial_id, value) for p, trial_id, value in shown})
        position = shown[-1][0] + 1
    paging = time.perf_counter() - began

    # Then every trial was seen once, in order: the best first, those without a metric last
    ids = [seen[p][0] for p in range(TRIALS)]
    assert len(set(ids)) == TRIALS and set(ids) == {f"S{i:05d}" for i in range(TRIALS)}
    values = [float(seen[p][1]) for p in range(len(finals))]
    assert values == finals and all(seen[p][1] == "" for p in range(len(finals), TRIALS))
    assert dom_rows(tab) < MAX_DOM_ROWS
    print(f"\npaged through {TRIALS:,} rows in {paging:.1f} s", file=sys.stderr)

    # and a second click puts the worst first
    tab.click("#trials th[data-column='default']")
    tab.wait_for_function(
        "v => Number(document.querySelector(\"#trials tbody tr[data-position='0'] "
        "td[data-column='default']\")?.textContent) === v",
        arg=finals[-1],
    )
    assert tab.get_attribute("#trials th[data-column='default']", "aria-sort") == "descending"


def test_filtered_by_status_on_the_server(opened) -> None:
    tab = opened
    failed = [f"S{i:05d}" for i in range(TRIALS) if STATUSES[i % len(STATUSES)] == TrialStatus.FAILED]

    # When the user shows the FAILED trials only
    tab.select_option("#status-filter", "FAILED")

    # Then the table holds those, counted, and its last row is the last of them
    tab.wait_for_function("n => document.querySelector('#trials').dataset.total === String(n)", arg=len(failed))
    tab.wait_for_function(
        "id => document.querySelector(\"#trials tbody tr[data-position='0']\")?.dataset.trialId === id", arg=failed[0]
    )
    assert tab.text_content("#shown-count") == f"{len(failed)} of {TRIALS} trials"
    tab.evaluate("() => { const w = document.querySelector('.table-wrap'); w.scrollTop = w.scrollHeight; }")
    tab.wait_for_selector(row(failed[-1], "FAILED"))
    statuses = tab.eval_on_selector_all("#trials tbody tr", "rows => rows.map((r) => r.dataset.status)")
    assert set(statuses) == {"FAILED"} and len(statuses) < MAX_DOM_ROWS


def test_a_long_curve_is_cut_down_to_the_chart_with_its_extremes(opened, tmp_path: Path) -> None:
    tab = opened
    # When the user opens the trial that reported 5,000 intermediate results
    tab.click(row("S00000"))
    # (the history comes in frames: wait for it all, the spike at 2,345 and the last result at 4,999)
    tab.wait_for_function(
        "() => Number(document.querySelector('#trial-curve').dataset.max) === 1000"
        " && Number(document.querySelector('#trial-curve').dataset.lastX) === 4999"
    )

    # Then its chart draws at most twice its width in points, and the spike among them
    width = tab.evaluate("() => document.querySelector('#trial-curve').clientWidth")
    drawn = int(tab.get_attribute("#trial-curve", "data-points"))
    assert drawn <= max(16, 2 * width) < CURVE_POINTS, (drawn, width)
    assert float(tab.get_attribute("#trial-curve", "data-max")) == SPIKE[1], "the highest result is kept"
    tab.screenshot(path=str(artifacts(tmp_path) / "webui-scale-curve.png"))
    print(f"\na curve of {CURVE_POINTS:,} results drawn as {drawn} points on a {width} px chart", file=sys.stderr)

    # and the overview chart, of the experiment's finals, is cut down to its width as well
    tab.wait_for_function("() => Number(document.querySelector('#overview-chart').dataset.points) > 0")
    overview = tab.evaluate(
        "() => { const c = document.querySelector('#overview-chart');"
        " return [Number(c.dataset.points), Number(c.dataset.max), c.clientWidth]; }"
    )
    assert overview[0] <= 2 * overview[2] and overview[1] == max(m for i in range(TRIALS) if (m := metric(i)))
