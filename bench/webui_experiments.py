"""The "All experiments" page at scale in headless Chromium: its first draw, a sort, and the list's read.

``python -m bench.webui_experiments --experiments 200 --trials 100000`` writes the experiments
and their trials (spread evenly, a third with a final metric) into the KV buckets as the
dispatcher keeps them (:func:`tests.fixtures.webui.put_states`, as :mod:`bench.scale_webui`),
starts a web UI on a private nats-server, and reports p50 (and max) over ``loads`` fresh
browser contexts of:

- ``first_draw_ms``: navigation start → every row drawn (the page's mark ``trialbus:experiments``);
- ``sort_ms``: a click on "Best metric" → the rows drawn in that order (a read of the list);
- ``rows``: rows in the table;

and, from a plain HTTP client, ``api_ms`` (p50 of 20 reads of ``GET /api/experiments``, the
request the page repeats every 2 s) with the answer's size. The list is O(experiments) per read
whatever the trials (their counts and best are kept by the model as trials change).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.scale_webui import _p50
from tests.fixtures.webui import put_states

FIRST_DRAW = "() => performance.getEntriesByName('trialbus:experiments')[0]?.startTime ?? null"
SORT = """async () => {
    const began = performance.now();
    document.querySelector("#experiments-table button[data-sort='best']").click();
    while (!(location.search.includes('sort=best')
             && document.querySelector("th[data-column='best'][aria-sort]")
             && document.querySelector('#experiments-rows').dataset.drawn === location.search)) {
        await new Promise((resolve) => requestAnimationFrame(resolve));
    }
    return performance.now() - began;
}"""


def states(experiments: int, trials: int, root: Path) -> list[Any]:
    """``experiments`` experiments (a third stopped, a third done), ``trials`` trials spread over them."""
    from contracts import ExperimentConfig, ExperimentState, ExperimentStatus, TrialState, TrialStatus

    start = datetime(2020, 1, 1, tzinfo=UTC)
    config = {
        "trialCommand": "true",
        "trialCodeDirectory": str(root),
        "trialConcurrency": 8,
        "trainingService": {"platform": "local"},
    }
    kinds = [ExperimentStatus.RUNNING, ExperimentStatus.STOPPED, ExperimentStatus.DONE]
    found: list[Any] = []
    for e in range(experiments):
        found.append(
            ExperimentState(
                id=f"exp{e:05d}",
                config=ExperimentConfig.model_validate({**config, "experimentName": f"bench {e}"}),
                start_time=start + timedelta(minutes=e),
                status=kinds[e % 3],
                team=f"team{e % 4}",
                owner=f"user{e % 7}",
            )
        )
    statuses = [TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.RUNNING]
    for i in range(trials):
        e = i % experiments
        found.append(
            TrialState(
                id=f"T{i:07d}",
                experiment_id=f"exp{e:05d}",
                sequence_id=i // experiments,
                status=statuses[i % 3],
                platform="local-gpu",
                parameters={"x": i},
                submit_time=start,
                start_time=start,
                final_metric=((i * 7919) % 100_003) / 1000 if i % 3 == 0 else None,
            )
        )
    return found


def measure(url: str, token: str, loads: int, say=print) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright  # a test dependency: imported where used

    runs = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1500, "height": 1000})
                page = context.new_page()
                page.set_default_timeout(60_000)
                page.goto(f"{url}/login?token={token}")
                page.goto(f"{url}/experiments")
                page.wait_for_function(FIRST_DRAW)
                first = page.evaluate(FIRST_DRAW)
                sort = page.evaluate(SORT)
                runs.append(
                    {"first_draw_ms": first, "sort_ms": sort, "rows": page.locator("#experiments-rows tr").count()}
                )
                context.close()
        finally:
            browser.close()
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        reads, size = [], 0
        for _ in range(20):
            began = time.perf_counter()
            answer = http.get(f"{url}/api/experiments")
            reads.append((time.perf_counter() - began) * 1000)
            size = len(answer.content)
    figures: dict[str, Any] = {key: _p50([run[key] for run in runs]) for key in ("first_draw_ms", "sort_ms", "rows")}
    figures.update(
        max_first_draw_ms=max(run["first_draw_ms"] for run in runs), api_ms=statistics.median(reads), api_bytes=size
    )
    say(
        f"  all experiments, {figures['rows']:.0f} rows, p50 of {loads} loads: first draw "
        f"{figures['first_draw_ms']:.0f} ms (max {figures['max_first_draw_ms']:.0f} ms), sort by best "
        f"{figures['sort_ms']:.0f} ms; GET /api/experiments p50 {figures['api_ms']:.1f} ms, "
        f"{figures['api_bytes'] / 1024:.0f} KiB"
    )
    return figures


def main() -> None:
    from tests.fixtures.nats import NatsServer
    from tests.fixtures.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m bench.webui_experiments", description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", type=int, default=200)
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-experiments-"))
    nats = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=nats)
    try:
        stack.start("webui")
        began = time.perf_counter()
        put_states(nats.url, states(args.experiments, args.trials, root))
        written = time.perf_counter() - began
        print(f"{args.experiments} experiments and {args.trials:,} trials written in {written:.0f} s")
        with httpx.Client(headers=stack.auth, timeout=30) as http:
            while sum(e["trialCount"] for e in http.get(f"{stack.webui}/api/experiments").json()) != args.trials:
                time.sleep(0.5)
        measure(stack.webui, stack.token, args.loads)
    finally:
        stack.stop()
        nats.stop()


if __name__ == "__main__":
    main()
