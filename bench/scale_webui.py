"""The web UI at scale in headless Chromium: time to interactive and the browser's memory.

:func:`measure_webui` opens an experiment's page ``loads`` times, each in a fresh browser
context, and reports p50 (and max) of:

- ``first_rows_ms``: navigation start → the table's first rows drawn (the page's own
  performance mark ``trialbus:rows``);
- ``interactive_ms``: navigation start → a click on "Default metric" answered (the rows sorted
  by the server drawn): the page is usable;
- ``sort_ms``: that click → its rows drawn;
- ``last_row_ms``: a scroll to the bottom → the last row drawn;
- ``heap_mib``: the page's JS heap in use after all that (CDP ``Performance.getMetrics``);
- ``renderer_mib``: the resident memory of the page's renderer process (psutil), where found;
- ``dom_rows``: table rows in the DOM (a window, whatever the experiment's size).

``python -m bench.scale_webui --trials 100000`` runs it alone: a private nats-server and web
UI, the trials written into the KV bucket as the dispatcher keeps them (a third with a final
metric), no dispatcher (``bench.scale`` measures the web UI on a stack that ran its trials).
The machine's other work shows in these figures: take the p50 of several loads.
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

import psutil

from tests.fixtures.webui import put_states

TARGET_MS = 1000.0

FIRST_ROWS = "() => performance.getEntriesByName('trialbus:rows')[0]?.startTime ?? null"
SORT = """async () => {
    const began = performance.now();
    document.querySelector("#trials th[data-column='default']").click();
    while (!(document.querySelector('#trials').dataset.sort === 'metric'
             && document.querySelector("#trials tbody tr[data-position='0']"))) {
        await new Promise((resolve) => requestAnimationFrame(resolve));
    }
    return [began, performance.now()];
}"""
LAST_ROW = """async () => {
    const wrap = document.querySelector('.table-wrap'), total = Number(document.querySelector('#trials').dataset.total);
    const began = performance.now();
    wrap.scrollTop = wrap.scrollHeight;
    while (!document.querySelector(`#trials tbody tr[data-position='${total - 1}']`)) {
        await new Promise((resolve) => requestAnimationFrame(resolve));
    }
    return performance.now() - began;
}"""


def _renderers() -> dict[int, float]:
    """Chromium renderer processes under this one: pid → resident MiB."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if "--type=renderer" in " ".join(child.cmdline()):
                found[child.pid] = child.memory_info().rss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _p50(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measure_webui(
    webui_url: str, experiment_id: str, token: str | None = None, loads: int = 5, say=print
) -> dict[str, Any]:
    """Open ``/experiments/<experiment_id>`` ``loads`` times (logged in with ``token``, the stack's
    API token, when given); the figures of the module docstring: p50 of each, and each load's."""
    from playwright.sync_api import sync_playwright  # a test dependency: imported where used

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    runs: list[dict[str, Any]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--enable-precise-memory-info"])
        try:
            for _ in range(loads):
                before = set(_renderers())
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                page.set_default_timeout(60_000)
                if token:
                    page.goto(f"{webui_url}/login?token={token}")
                page.goto(f"{webui_url}/experiments/{experiment_id}")
                page.wait_for_function(FIRST_ROWS)
                first_rows = page.evaluate(FIRST_ROWS)
                began, answered = page.evaluate(SORT)
                last_row = page.evaluate(LAST_ROW)
                cdp = context.new_cdp_session(page)
                cdp.send("Performance.enable")
                metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                renderers = {pid: mib for pid, mib in _renderers().items() if pid not in before}
                runs.append(
                    {
                        "first_rows_ms": first_rows,
                        "interactive_ms": answered,
                        "sort_ms": answered - began,
                        "last_row_ms": last_row,
                        "heap_mib": metrics.get("JSHeapUsedSize", 0) / 2**20,
                        "renderer_mib": max(renderers.values()) if renderers else None,
                        "dom_rows": page.locator("#trials tbody tr").count(),
                        "total": int(page.get_attribute("#trials", "data-total") or 0),
                    }
                )
                context.close()
        finally:
            browser.close()
    keys = ["first_rows_ms", "interactive_ms", "sort_ms", "last_row_ms", "heap_mib", "renderer_mib", "dom_rows"]
    figures: dict[str, Any] = {key: _p50([run[key] for run in runs]) for key in keys}
    figures["max_interactive_ms"] = max(run["interactive_ms"] for run in runs)
    figures["max_heap_mib"] = max(run["heap_mib"] for run in runs)
    figures["trials"] = runs[0]["total"] if runs else 0
    figures["runs"] = runs
    mark = "ok" if figures["interactive_ms"] <= TARGET_MS else f"over the {TARGET_MS:.0f} ms target"
    renderer = f", renderer {figures['renderer_mib']:.0f} MiB resident" if figures["renderer_mib"] else ""
    say(
        f"  web UI, {figures['trials']:,} trials, p50 of {loads} loads: first rows {figures['first_rows_ms']:.0f} ms, "
        f"interactive {figures['interactive_ms']:.0f} ms ({mark}; max {figures['max_interactive_ms']:.0f} ms), "
        f"sort {figures['sort_ms']:.0f} ms, last row {figures['last_row_ms']:.0f} ms"
    )
    say(
        f"  web UI memory: JS heap {figures['heap_mib']:.1f} MiB (max {figures['max_heap_mib']:.1f}){renderer}; "
        f"{figures['dom_rows']:.0f} table rows in the DOM"
    )
    return figures


def main() -> None:
    from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus
    from tests.fixtures.nats import NatsServer
    from tests.fixtures.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m bench.scale_webui", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-webui-"))
    nats = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=nats)
    try:
        stack.start("webui")
        start = datetime(2020, 1, 1, tzinfo=UTC)
        config = ExperimentConfig.model_validate(
            {
                "experimentName": "scale",
                "trialCommand": "true",
                "trialCodeDirectory": str(root),
                "trialConcurrency": 1000,
                "trainingService": {"platform": "local"},
            }
        )
        statuses = [TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.RUNNING]
        states = [ExperimentState(id="scale001", config=config, start_time=start)] + [
            TrialState(
                id=f"T{i:06d}",
                experiment_id="scale001",
                sequence_id=i,
                status=statuses[i % 3],
                platform="local-gpu",
                parameters={"x": i, "lr": 10 ** -(1 + i % 5)},
                submit_time=start,
                start_time=start,
                end_time=start + timedelta(milliseconds=i) if i % 3 != 2 else None,
                final_metric=((i * 7919) % 100_003) / 1000 if i % 3 == 0 else None,
            )
            for i in range(args.trials)
        ]
        began = time.perf_counter()
        put_states(nats.url, states)
        print(f"{args.trials:,} trials written in {time.perf_counter() - began:.0f} s; work dir {root}")
        with __import__("httpx").Client(headers=stack.auth, timeout=30) as http:
            while http.get(f"{stack.webui}/api/experiments/scale001").json().get("trialCount") != args.trials:
                time.sleep(0.5)
        webui = psutil.Process(stack.procs["webui"].pid).memory_info().rss / 2**20
        print(f"  web UI service: {webui:.0f} MiB resident with {args.trials:,} trials")
        measure_webui(stack.webui, "scale001", stack.token, loads=args.loads)
    finally:
        stack.stop()
        nats.stop()


if __name__ == "__main__":
    main()
