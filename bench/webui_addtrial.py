"""Add a trial and the Logs view at scale, in headless Chromium: first draw of each at 100,000 trials.

``python -m bench.webui_addtrial --trials 100000`` writes the trials into the KV bucket as the dispatcher keeps
them (:func:`tests.fixtures.webui.put_states`, as :mod:`bench.scale_webui`), and 1,000 log lines of each service
about the experiment on the LOGS stream (what the stream keeps at most), then opens the page ``loads`` times,
each in a fresh browser context, and reports p50 (and max) of:

- ``addtrial_ms``: navigation start → the Add trial form drawn, copied from the newest trial (``?add=<id>``;
  the page's performance mark ``trialbus:addtrial``);
- ``copy_ms``: "Copy from trial" of the newest trial's number typed and clicked → its parameters in the form
  (one row read at that position: O(log n));
- ``logs_ms``: navigation start → the Logs view's 1,000 lines drawn (``?logs=1``; mark ``trialbus:logs``).

Neither view reads more than one trial, nor more than the stream's 2,000 lines: the figures should not grow
with the experiment. The machine's other work shows in them: take the p50 of several loads.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import nats
import orjson

from bench.scale_webui import _p50
from tests.fixtures.webui import put_states

EXPERIMENT = "scale001"
MARK = "(name) => performance.getEntriesByName(name)[0]?.startTime ?? null"
COPY = """async (number) => {
    const began = performance.now();
    document.querySelector('#add-trial-from').value = String(number);
    document.querySelector('#add-trial-copy').click();
    while (JSON.parse(document.querySelector('#add-trial-json').value).x !== number) {
        await new Promise((resolve) => requestAnimationFrame(resolve));
    }
    return performance.now() - began;
}"""


def put_log_lines(url: str, lines: int) -> None:
    """``lines`` lines of the dispatcher's and of the tuner's about the experiment, as buslog publishes them."""

    async def write() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for service in ("dispatcher", "tuner"):
                for i in range(lines):
                    line = {
                        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                        "service": service,
                        "level": "INFO",
                        "logger": f"services.{service}",
                        "message": f"experiment {EXPERIMENT}: line {i} of the {service}",
                    }
                    await js.publish(f"logs.{EXPERIMENT}.{service}", orjson.dumps(line))
        finally:
            await nc.drain()

    asyncio.run(write())


def measure(webui_url: str, token: str, newest: dict[str, Any], loads: int, say=print) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright  # a test dependency: imported where used

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    runs: list[dict[str, Any]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                page.set_default_timeout(60_000)
                page.goto(f"{webui_url}/login?token={token}")
                page.goto(f"{webui_url}/experiments/{EXPERIMENT}?add={newest['id']}")
                page.wait_for_function(MARK, arg="trialbus:addtrial")
                addtrial = page.evaluate(MARK, "trialbus:addtrial")
                page.locator("#add-trial-from").fill("0")  # another trial first: the copy must change the form
                page.evaluate("() => { document.querySelector('#add-trial-json').value = '{\"x\": -1}'; }")
                copy = page.evaluate(COPY, newest["sequenceId"])
                page.goto(f"{webui_url}/experiments/{EXPERIMENT}?logs=1")
                page.wait_for_function(MARK, arg="trialbus:logs")
                logs = page.evaluate(MARK, "trialbus:logs")
                shown = page.locator("#logs-lines li").count()
                runs.append({"addtrial_ms": addtrial, "copy_ms": copy, "logs_ms": logs, "lines": shown})
                context.close()
        finally:
            browser.close()
    keys = ["addtrial_ms", "copy_ms", "logs_ms"]
    figures: dict[str, Any] = {key: _p50([run[key] for run in runs]) for key in keys}
    figures.update({f"max_{key}": max(run[key] for run in runs) for key in keys})
    figures["lines"] = runs[0]["lines"] if runs else 0
    figures["runs"] = runs
    say(
        f"  p50 of {loads} loads: Add trial form (copied from the newest trial) {figures['addtrial_ms']:.0f} ms "
        f"(max {figures['max_addtrial_ms']:.0f}), copy by number {figures['copy_ms']:.0f} ms "
        f"(max {figures['max_copy_ms']:.0f}), Logs view {figures['lines']} lines {figures['logs_ms']:.0f} ms "
        f"(max {figures['max_logs_ms']:.0f})"
    )
    return figures


def main() -> None:
    from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus
    from tests.fixtures.nats import NatsServer
    from tests.fixtures.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m bench.webui_addtrial", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-addtrial-"))
    server = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=server)
    try:
        stack.start("webui")
        start = datetime(2020, 1, 1, tzinfo=UTC)
        config = ExperimentConfig.model_validate(
            {
                "experimentName": "scale",
                "trialCommand": "true",
                "trialCodeDirectory": str(root),
                "trialConcurrency": 1000,
                "searchSpace": {
                    "x": {"_type": "randint", "_value": [0, 10**6]},
                    "lr": {"_type": "choice", "_value": [0.1]},
                },
                "trainingService": {"platform": "local"},
            }
        )
        statuses = [TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.RUNNING]
        states = [ExperimentState(id=EXPERIMENT, config=config, start_time=start)] + [
            TrialState(
                id=f"T{i:06d}",
                experiment_id=EXPERIMENT,
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
        put_states(server.url, states)
        put_log_lines(server.url, 1000)
        print(f"{args.trials:,} trials and 2,000 log lines written in {time.perf_counter() - began:.0f} s")
        with httpx.Client(headers=stack.auth, timeout=30) as http:
            while http.get(f"{stack.webui}/api/experiments/{EXPERIMENT}").json().get("trialCount") != args.trials:
                time.sleep(0.5)
        newest = {"id": f"T{args.trials - 1:06d}", "sequenceId": args.trials - 1}
        measure(stack.webui, stack.token, newest, args.loads)
    finally:
        stack.stop()
        server.stop()


if __name__ == "__main__":
    main()
