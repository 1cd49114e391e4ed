"""The web UI's analysis views at scale: the parallel coordinates' first draw at 100,000 trials.

``python -m bench.webui_hparams --trials 100000`` starts a private nats-server and web UI, writes
the trials into the KV bucket as the dispatcher keeps them (:func:`tests.fixtures.webui.put_states`,
as ``bench.scale_webui`` does: a third with a final metric, parameters from a search space with a
nested choice), then reports, p50 of ``loads`` page loads in headless Chromium:

- ``first_draw_ms``: navigation start → the parallel coordinates drawn (the page's performance
  mark ``trialbus:hparams``), with the lines drawn (at most 2,000, whatever the trials);
- ``top20_ms``: "top 20 %" chosen → its lines drawn;
- ``durations_ms``: the Durations tab chosen → its histogram drawn;

and, from an HTTP client, each route's answer time and size (``hyper-parameters`` at 100 % and
20 %, ``durations``). The machine's other work shows in these figures: take the p50.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.scale_webui import FIRST_ROWS, _p50
from tests.fixtures.webui import put_states

EXPERIMENT = "hparams001"
SPACE = {
    "lr": {"_type": "loguniform", "_value": [1e-5, 1e-1]},
    "batch": {"_type": "choice", "_value": [16, 32, 64, 128]},
    "layers": {"_type": "randint", "_value": [1, 9]},
    "optimizer": {
        "_type": "choice",
        "_value": [
            {"_name": "sgd", "momentum": {"_type": "uniform", "_value": [0, 1]}},
            {"_name": "adam", "beta1": {"_type": "uniform", "_value": [0.8, 0.999]}},
        ],
    },
}
FIRST_DRAW = "() => performance.getEntriesByName('trialbus:hparams')[0]?.startTime ?? null"
TOP_20 = """async () => {
    const began = performance.now(), chart = document.querySelector('#hp-chart');
    const select = document.querySelector('#hp-top'), rule = document.querySelector('#hp-rule');
    select.value = '20';
    select.dispatchEvent(new Event('change'));
    while (!rule.textContent.includes('top 20 %')) await new Promise((resolve) => requestAnimationFrame(resolve));
    return [performance.now() - began, Number(chart.dataset.lines)];
}"""
DURATIONS = """async () => {
    const began = performance.now();
    document.querySelector('#tab-durations').click();
    while (!document.querySelector('#dur-chart').dataset.count) {
        await new Promise((resolve) => requestAnimationFrame(resolve));
    }
    return performance.now() - began;
}"""


def states(trials: int, root: Path) -> list[Any]:
    from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus

    start = datetime(2020, 1, 1, tzinfo=UTC)
    config = ExperimentConfig.model_validate(
        {
            "experimentName": "hparams-scale",
            "trialCommand": "true",
            "trialCodeDirectory": str(root),
            "trialConcurrency": 1000,
            "searchSpace": SPACE,
            "trainingService": {"platform": "local"},
        }
    )
    statuses = [TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.RUNNING]
    found: list[Any] = [ExperimentState(id=EXPERIMENT, config=config, start_time=start)]
    for i in range(trials):
        optimizer = {"_name": "sgd", "momentum": (i % 97) / 97} if i % 2 else {"_name": "adam", "beta1": 0.9}
        found.append(
            TrialState(
                id=f"P{i:06d}",
                experiment_id=EXPERIMENT,
                sequence_id=i,
                status=statuses[i % 3],
                platform="local-gpu",
                parameters={
                    "lr": 10 ** -(1 + i % 5),
                    "batch": [16, 32, 64, 128][i % 4],
                    "layers": 1 + i % 8,
                    "optimizer": optimizer,
                },
                submit_time=start,
                start_time=start,
                end_time=start + timedelta(seconds=i % 3600) if i % 3 != 2 else None,
                final_metric=((i * 7919) % 100_003) / 1000 if i % 3 == 0 else None,
            )
        )
    return found


def routes(http: httpx.Client, base: str) -> dict[str, tuple[float, int]]:
    """Each route's answer time (ms, p50 of 5) and size (bytes)."""
    found = {}
    for name, path in (
        ("hyper-parameters (all)", "hyper-parameters"),
        ("hyper-parameters (top 20 %)", "hyper-parameters?top=20"),
        ("durations", "durations"),
    ):
        times, size = [], 0
        for _ in range(5):
            began = time.perf_counter()
            answer = http.get(f"{base}/api/experiments/{EXPERIMENT}/{path}")
            times.append((time.perf_counter() - began) * 1000)
            size = len(answer.content)
        found[name] = (_p50(times) or 0.0, size)
    return found


def measure(webui_url: str, token: str | None, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright  # a test dependency: imported where used

    runs = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                page.set_default_timeout(60_000)
                if token:
                    page.goto(f"{webui_url}/login?token={token}")
                page.goto(f"{webui_url}/experiments/{EXPERIMENT}")
                page.wait_for_function(FIRST_DRAW)
                first = page.evaluate(FIRST_DRAW)
                page.wait_for_function(FIRST_ROWS)
                rows = page.evaluate(FIRST_ROWS)
                lines = int(page.get_attribute("#hp-chart", "data-lines") or 0)
                top20, top20_lines = page.evaluate(TOP_20)
                durations = page.evaluate(DURATIONS)
                runs.append(
                    {
                        "first_draw_ms": first,
                        "first_rows_ms": rows,
                        "lines": lines,
                        "top20_ms": top20,
                        "top20_lines": top20_lines,
                        "durations_ms": durations,
                    }
                )
                context.close()
        finally:
            browser.close()
    return {key: _p50([run[key] for run in runs]) for key in runs[0]} | {"runs": runs}


def main() -> None:
    from tests.fixtures.nats import NatsServer
    from tests.fixtures.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m bench.webui_hparams", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-hparams-"))
    nats = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=nats)
    try:
        stack.start("webui")
        began = time.perf_counter()
        put_states(nats.url, states(args.trials, root))
        print(f"{args.trials:,} trials written in {time.perf_counter() - began:.0f} s; work dir {root}")
        with httpx.Client(headers=stack.auth, timeout=60) as http:
            while http.get(f"{stack.webui}/api/experiments/{EXPERIMENT}").json().get("trialCount") != args.trials:
                time.sleep(0.5)
            for name, (ms, size) in routes(http, stack.webui).items():
                print(f"  GET {name}: {ms:.0f} ms, {size / 1024:.0f} KiB")
        figures = measure(stack.webui, stack.token, args.loads)
        print(
            f"  web UI, {args.trials:,} trials, p50 of {args.loads} loads: hyper-parameters first drawn "
            f"{figures['first_draw_ms']:.0f} ms after navigation start ({figures['lines']:.0f} lines; the table's "
            f"first rows {figures['first_rows_ms']:.0f} ms); "
            f"top 20 % redrawn in {figures['top20_ms']:.0f} ms ({figures['top20_lines']:.0f} lines); "
            f"durations drawn in {figures['durations_ms']:.0f} ms"
        )
    finally:
        stack.stop()
        nats.stop()


if __name__ == "__main__":
    main()
