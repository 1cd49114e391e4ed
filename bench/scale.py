"""``make bench-scale``: one experiment of 100,000 trials, and how the stack answers at that size.

A private stack (nats-server, dispatcher, and the fake adapter standing in for local-gpu: no
process per trial, ``services/adapters/fake``) takes ``--trials`` trials (100,000) submitted as
fast as it accepts them, ``--concurrency`` (1,000) running at once, each ending at once. Printed:

- the submit rate, and the rate of ended trials per stretch of 10 % of them (a rate that falls
  as the experiment grows means a cost per trial that grows with it);
- API p50/p95 over REST at that size: the experiment's summary, a page of trials (the first,
  one deep in the list, by best metric, filtered by status), one trial, one trial's metrics;
- metric records a second from keepers' batches through the gateway to a subscribed tuner
  (:mod:`bench.scale_metrics`): ``--metric-trials`` (1,000) of the trials × ``--per-trial``
  (1,000) records, 1,000,000 in the experiment; then one trial's metrics are among the reads;
- the dispatcher's resident memory, and its restart with those trials and records: SIGTERM,
  start, until it answers the summary with every trial;
- the web UI's experiment page in headless Chromium at that size (:mod:`bench.scale_webui`): time
  to interactive (navigation → its first rows drawn and a sort answered) and the page's memory;
- the built-in tuners' ask latency after ``--tuner-trials`` (100,000; TPE 10,000) trials, and
  what they keep (:mod:`bench.scale_tuner`).

``python -m bench.scale --trials 2000`` is the short version (``tests/e2e/test_scale.py``
runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.scale_metrics import MetricFigures, metric_rate
from bench.scale_tuner import tuner_ask_latency
from bench.scale_webui import measure_webui
from bench.trials import percentile
from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import Stack
from trialbus.client import AsyncClient

TARGET_MS = 200.0
TARGET_RECORDS = 100_000  # metric records a second, keepers → a subscribed tuner


@dataclass
class Figures:
    trials: int
    submit_rate: float = 0.0
    #: (trials ended so far, trials/s over the stretch before it)
    end_rates: list[tuple[int, float]] = field(default_factory=list)
    #: read → latencies in ms
    reads: dict[str, list[float]] = field(default_factory=dict)
    restart_seconds: float = 0.0
    metrics: MetricFigures | None = None
    #: the web UI page's figures (bench.scale_webui), when measured
    webui: dict = field(default_factory=dict)
    #: tuner → its ask latency and memory figures (bench.scale_tuner)
    tuners: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the dispatcher's resident memory with every trial ended, MiB
    dispatcher_mib: float = 0.0


async def submit_all(url: str, experiment: str, trials: int, at_once: int = 200) -> float:
    """Submit ``trials`` trials, ``at_once`` requests in flight; trials/s."""
    queue = iter(range(trials))
    begin = time.perf_counter()

    async def worker(client: AsyncClient) -> None:
        for i in queue:
            await client.submit_trial(experiment, {"x": i, "duration": 0})

    async with AsyncClient(url) as client:
        await asyncio.gather(*(worker(client) for _ in range(at_once)))
    return trials / (time.perf_counter() - begin)


def ended_count(stack: Stack, experiment: str) -> int:
    counts = stack.rest("GET", f"/experiments/{experiment}").json()["trialCounts"]
    return sum(n for status, n in counts.items() if status not in ("WAITING", "RUNNING"))


def wait_for_ends(stack: Stack, experiment: str, trials: int, figures: Figures, say) -> None:
    step, last, last_at = max(1, trials // 10), 0, time.perf_counter()
    mark = step
    while last < trials:
        time.sleep(0.5)
        done = ended_count(stack, experiment)
        now = time.perf_counter()
        if done >= mark or done == trials:
            rate = (done - last) / (now - last_at)
            figures.end_rates.append((done, rate))
            say(f"  {done:>7,} trials ended: {rate:,.0f} trials/s over the last {done - last:,}")
            last, last_at = done, now
            mark = (done // step + 1) * step


def time_reads(stack: Stack, experiment: str, trials: int, rounds: int = 50) -> dict[str, list[float]]:
    """Each read ``rounds`` times over one keep-alive connection; ms each."""
    base = f"/experiments/{experiment}"
    with httpx.Client(base_url=stack.api, headers=stack.auth, timeout=30) as http:
        first = http.get(f"{base}/trials?limit=100").json()
        ids = [t["id"] for t in first["trials"]]
        deep = http.get(f"{base}/trials?limit=5000").json()["nextCursor"] or first["nextCursor"]  # past 5,000
        some = random.Random(1).sample(ids, min(len(ids), 20))
        reads = {
            "experiment summary": lambda i: http.get(base),
            "page of 100 (first)": lambda i: http.get(f"{base}/trials?limit=100"),
            "page of 100 (deep)": lambda i: http.get(f"{base}/trials?limit=100" + (f"&cursor={deep}" if deep else "")),
            "page of 100, best metric first": lambda i: http.get(f"{base}/trials?limit=100&sort=metric"),
            "page of 100, status filter": lambda i: http.get(f"{base}/trials?limit=100&status=SUCCEEDED"),
            "one trial": lambda i: http.get(f"/trials/{some[i % len(some)]}"),
            "one trial's metrics": lambda i: http.get(f"/trials/{some[i % len(some)]}/metrics"),
        }
        found: dict[str, list[float]] = {}
        for name, read in reads.items():
            found[name] = []
            for i in range(rounds):
                begin = time.perf_counter()
                answer = read(i)
                found[name].append((time.perf_counter() - begin) * 1000)
                answer.raise_for_status()
        return found


def restart_dispatcher(stack: Stack, experiment: str, trials: int) -> float:
    """Seconds from SIGTERM to a dispatcher answering the summary with every trial."""
    begin = time.perf_counter()
    stack.kill("dispatcher", signal.SIGTERM)
    stack.start("dispatcher")
    while True:
        try:
            if stack.rest("GET", f"/experiments/{experiment}").json()["trialCount"] == trials:
                return time.perf_counter() - begin
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.05)


def first_trials(stack: Stack, experiment: str, count: int) -> list[str]:
    """The ids of the experiment's first ``count`` trials (by submission), a page at a time."""
    ids: list[str] = []
    cursor = None
    while len(ids) < count:
        query = f"limit={min(5000, count - len(ids))}" + (f"&cursor={cursor}" if cursor else "")
        page = stack.rest("GET", f"/experiments/{experiment}/trials?{query}").json()
        ids += [t["id"] for t in page["trials"]]
        if not (cursor := page["nextCursor"]):
            break
    return ids


def measure(
    trials: int,
    concurrency: int,
    say=print,
    metric_trials: int = 1000,
    per_trial: int = 1000,
    tuner_trials: int = 0,
    webui: bool = False,
) -> Figures:
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-scale-"))
    nats = NatsServer(root / "jetstream").start()
    stack = Stack(root=root, nats=nats, service_env={"fake": {"TRIALBUS_FAKE_CAPACITY": str(concurrency)}})
    figures = Figures(trials)
    try:
        stack.start("dispatcher", "fake", "gateway")
        code = root / "code"
        code.mkdir()
        (code / "noop.py").write_text("")
        config = {
            "experimentName": "scale",
            "trialCommand": "true",
            "trialCodeDirectory": str(code),
            "trialConcurrency": concurrency,
            "trainingService": {"platform": "local"},
        }
        experiment = stack.rest("POST", "/experiments", json=config).json()["id"]
        say(f"{trials:,} trials, {concurrency:,} at once, through the fake adapter (no processes); work dir {root}")
        figures.submit_rate = asyncio.run(submit_all(nats.url, experiment, trials))
        say(f"  submitted at {figures.submit_rate:,.0f} trials/s")
        wait_for_ends(stack, experiment, trials, figures, say)
        figures.dispatcher_mib = psutil.Process(stack.procs["dispatcher"].pid).memory_info().rss / 2**20
        say(f"  dispatcher memory with {trials:,} trials: {figures.dispatcher_mib:,.0f} MiB resident")
        if metric_trials and per_trial:
            reporting = first_trials(stack, experiment, metric_trials)
            figures.metrics = metric_rate(nats.url, stack.gateway, stack.secret, experiment, reporting, per_trial)
            rate, mark = figures.metrics.rate, figures.metrics.rate >= TARGET_RECORDS
            say(
                f"  metric records, {len(reporting):,} trials' keepers → gateway → a subscribed tuner: "
                f"{figures.metrics.records:,} records at {rate:,.0f} records/s "
                f"({'ok' if mark else f'under the {TARGET_RECORDS:,} target'})"
            )
        figures.reads = time_reads(stack, experiment, trials)
        for name, ms in figures.reads.items():
            p95 = percentile(ms, 95)
            verdict = "ok" if p95 <= TARGET_MS else f"over the {TARGET_MS:.0f} ms target"
            say(f"  {name:<32} p50 {statistics.median(ms):7.1f} ms   p95 {p95:7.1f} ms   ({verdict})")
        figures.restart_seconds = restart_dispatcher(stack, experiment, trials)
        records = f" and {figures.metrics.records:,} metric records" if figures.metrics else ""
        say(
            f"  dispatcher restart with {trials:,} trials{records} (SIGTERM → the summary with every trial): "
            f"{figures.restart_seconds:.1f} s"
        )
        if webui:
            stack.start("webui")  # it reads every trial at start
            figures.webui = measure_webui(stack.webui, experiment, stack.token, say=say)
        if tuner_trials:
            figures.tuners = tuner_ask_latency(say, trials=tuner_trials, tpe_trials=max(1, tuner_trials // 10))
        return figures
    finally:
        stack.stop()
        nats.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--metric-trials", type=int, default=1000, help="trials that report metrics (0: none)")
    parser.add_argument("--per-trial", type=int, default=1000, help="metric records each of them reports")
    parser.add_argument(
        "--tuner-trials",
        type=int,
        default=100_000,
        help="trials told to each built-in tuner before timing its asks (TPE: a tenth; 0: none)",
    )
    parser.add_argument("--no-webui", action="store_true", help="leave out the web UI's page (needs Chromium)")
    args = parser.parse_args()
    measure(
        args.trials,
        args.concurrency,
        metric_trials=args.metric_trials,
        per_trial=args.per_trial,
        tuner_trials=args.tuner_trials,
        webui=not args.no_webui,
    )


if __name__ == "__main__":
    main()
