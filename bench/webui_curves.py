"""The all-curves chart at scale in headless Chromium: its first draw, and the step filter.

``python -m bench.webui_curves --trials 100000 --reporting 10000 --steps 50`` writes the trials
into the KV bucket as the dispatcher keeps them (as :mod:`bench.scale_webui`) and the
intermediate results of ``reporting`` of them (spread over the experiment) into METRICS as the
gateway publishes a keeper's batch, then reports:

- ``curves_ms``: navigation start → the all-curves chart drawn (the page's performance mark
  ``trialbus:curves``), p50 of ``loads`` fresh browser contexts;
- ``step_ms``: Enter in the step filter → the ranking at that step drawn (the first time a
  step is asked the server builds its ranking: O(m log m) for m trials reporting);
- the server's answers alone (HTTP, no browser): the chart, a step ranked the first time and
  again, and two trials compared;
- the web UI service's resident memory with every trial's results kept.
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
import psutil

from bench.scale_webui import _p50
from tests.fixtures.webui import put_metrics, put_states

CURVES_MARK = "() => performance.getEntriesByName('trialbus:curves')[0]?.startTime ?? null"
STEP = """async (step) => {
    const input = document.querySelector('#step-input');
    input.value = String(step);
    const began = performance.now();
    input.form.requestSubmit();
    while (document.querySelector('#all-curves').dataset.step !== String(step)) {
        await new Promise((resolve) => requestAnimationFrame(resolve));
    }
    return performance.now() - began;
}"""


def curve(i: int, steps: int) -> list[float]:
    """Trial i's results: rising to a plateau of its own, with a per-trial wobble (rankings change)."""
    top = ((i * 7919) % 1000) / 1000
    return [round(top * (1 - 0.9 ** (s + 1)) + 0.05 * (((i + s) * 31) % 7) / 7, 5) for s in range(steps)]


def measure_curves(webui_url: str, experiment_id: str, token: str | None, loads: int, step: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright  # a test dependency: imported where used

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    runs: list[dict[str, float]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            for load in range(loads):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                page.set_default_timeout(60_000)
                if token:
                    page.goto(f"{webui_url}/login?token={token}")
                page.goto(f"{webui_url}/experiments/{experiment_id}")
                page.wait_for_function(CURVES_MARK)
                drawn = page.evaluate(CURVES_MARK)
                step_ms = page.evaluate(STEP, step + load)  # a step not asked before: its ranking is built
                runs.append(
                    {
                        "curves_ms": drawn,
                        "step_ms": step_ms,
                        "series": len((page.get_attribute("#all-curves", "data-series") or "").split(",")),
                    }
                )
                context.close()
        finally:
            browser.close()
    return {key: _p50([run[key] for run in runs]) for key in ("curves_ms", "step_ms", "series")} | {"runs": runs}


def timed(http: httpx.Client, url: str) -> tuple[float, Any]:
    began = time.perf_counter()
    answer = http.get(url)
    answer.raise_for_status()
    return (time.perf_counter() - began) * 1000, answer.json()


def main() -> None:
    from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus
    from tests.fixtures.nats import NatsServer
    from tests.fixtures.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m bench.webui_curves", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--reporting", type=int, default=10_000, help="trials with intermediate results")
    parser.add_argument("--steps", type=int, default=50, help="intermediate results per reporting trial")
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-curves-"))
    nats = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=nats)
    try:
        stack.start("webui")
        start = datetime(2020, 1, 1, tzinfo=UTC)
        config = ExperimentConfig.model_validate(
            {
                "experimentName": "curves",
                "trialCommand": "true",
                "trialCodeDirectory": str(root),
                "trialConcurrency": 1000,
                "trainingService": {"platform": "local"},
            }
        )
        every = max(1, args.trials // max(1, args.reporting))
        reporting = {f"T{i:06d}": curve(i, args.steps) for i in range(0, args.trials, every)}
        states = [ExperimentState(id="scale001", config=config, start_time=start)] + [
            TrialState(
                id=f"T{i:06d}",
                experiment_id="scale001",
                sequence_id=i,
                status=TrialStatus.SUCCEEDED if i % 3 else TrialStatus.RUNNING,
                platform="local-gpu",
                parameters={"x": i, "lr": 10 ** -(1 + i % 5)},
                submit_time=start,
                start_time=start,
                end_time=start + timedelta(milliseconds=i) if i % 3 else None,
                final_metric=reporting[f"T{i:06d}"][-1] if f"T{i:06d}" in reporting and i % 3 else None,
                intermediate_count=args.steps if f"T{i:06d}" in reporting else 0,
            )
            for i in range(args.trials)
        ]
        began = time.perf_counter()
        put_states(nats.url, states)
        put_metrics(nats.url, "scale001", reporting)
        results = len(reporting) * args.steps
        print(
            f"{args.trials:,} trials, {len(reporting):,} of them with {args.steps} intermediate results "
            f"({results:,}), written in {time.perf_counter() - began:.0f} s; work dir {root}"
        )
        base = f"{stack.webui}/api/experiments/scale001"
        with httpx.Client(headers=stack.auth, timeout=60) as http:
            while http.get(base).json().get("trialCount") != args.trials:
                time.sleep(0.5)
            while http.get(f"{base}/intermediate?trials=1").json()["reported"] < len(reporting):
                time.sleep(0.5)
            webui = psutil.Process(stack.procs["webui"].pid).memory_info().rss / 2**20
            chart_ms, chart = timed(http, f"{base}/intermediate")
            first_ms, _ = timed(http, f"{base}/intermediate?step=7")
            again_ms, _ = timed(http, f"{base}/intermediate?step=7")
            pair = ",".join(c["trialId"] for c in chart["curves"][:2])
            compare_ms, _ = timed(http, f"{base}/compare?trials={pair}")
        print(f"  web UI service: {webui:.0f} MiB resident with {args.trials:,} trials and {results:,} results kept")
        print(
            f"  server: chart ({len(chart['curves'])} curves) {chart_ms:.0f} ms, step ranked first {first_ms:.0f} ms, "
            f"again {again_ms:.0f} ms, compare of 2 {compare_ms:.0f} ms"
        )
        figures = measure_curves(stack.webui, "scale001", stack.token, args.loads, step=10)
        print(
            f"  all-curves chart, p50 of {args.loads} loads: first draw {figures['curves_ms']:.0f} ms after navigation "
            f"start ({figures['series']:.0f} curves); step filter answered in {figures['step_ms']:.0f} ms"
        )
        for run in figures["runs"]:
            print(f"    load: first draw {run['curves_ms']:.0f} ms, step {run['step_ms']:.0f} ms")
    finally:
        stack.stop()
        nats.stop()


if __name__ == "__main__":
    main()
