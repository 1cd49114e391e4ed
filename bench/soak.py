"""``make soak`` / ``python -m bench.soak``: nothing is lost when any part of the stack dies.

Runs ``trialbus up`` (the real supervisor and services, on free ports and a fresh data dir),
then an experiment driven by the tuner service: ``--trials`` trials (300) at ``--concurrency``
(16), each reporting ``--metrics`` intermediate results (20) and a final one. While it runs,
each of ``--kill`` (local-gpu, metrics-gateway, nats-server, dispatcher, tuner) is SIGKILLed
once, spread over the run, each after the previous one is back; only ``trialbus up`` restarts
them. Then it checks what a user would: every trial succeeded, ran once, and has exactly its
metrics (in the METRICS stream and in the dispatcher's view), and prints the figures.
Exit 0 only when every trial succeeded, every metric set is exact, 0 duplicates, 0 stuck.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import textwrap
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import nats
from rich.console import Console
from rich.table import Table

from contracts import MetricRecord
from contracts.metrics import records_of
from tests.fixtures.up import Up, new_ports
from trialbus.client import AsyncClient, TrialbusError

KILLS = ("local-gpu", "metrics-gateway", "nats-server", "dispatcher", "tuner")
TRIAL = """
import os, time
import nni

params = nni.get_next_parameter()
with open(os.environ["SOAK_RUN_LOG"], "a") as log:
    log.write(f"{{os.environ['NNI_TRIAL_JOB_ID']}} {{os.getpid()}}\\n")
for i in range({metrics}):
    nni.report_intermediate_result(params["x"] * (i + 1))
    time.sleep({pause})
nni.report_final_result(params["x"])
"""


@dataclass
class Kill:
    part: str
    #: Trials ended when it was killed.
    at: int
    #: Seconds from the kill until the restarted part was ready again (None: never).
    back_after: float | None = None


@dataclass
class SoakResult:
    trials: int
    #: The parts to kill, once each.
    planned: tuple[str, ...] = ()
    seconds: float = 0.0
    submitted: int = 0
    succeeded: int = 0
    ended_otherwise: Counter = field(default_factory=Counter)
    stuck: int = 0
    lost: int = 0
    duplicated: int = 0
    metrics_expected: int = 0
    metrics_stored: int = 0
    metrics_lost: int = 0
    metrics_duplicated: int = 0
    metrics_wrong: int = 0
    #: Trials whose dispatcher view (intermediate count, final metric) is not what they reported.
    views_wrong: int = 0
    kills: list[Kill] = field(default_factory=list)
    stop_seconds: float = 0.0
    stop_code: int | None = None
    problems: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        exact = self.metrics_lost == self.metrics_duplicated == self.metrics_wrong == self.views_wrong == 0
        return (
            self.succeeded == self.trials
            and exact
            and self.duplicated == 0
            and self.stuck == 0
            and self.lost == 0
            and self.stop_code == 0
            and [k.part for k in self.kills] == list(self.planned)
            and all(k.back_after is not None for k in self.kills)
        )


def soak(
    root: Path,
    trials: int = 300,
    concurrency: int = 16,
    metrics: int = 20,
    pause: float = 0.02,
    kills: tuple[str, ...] = KILLS,
    timeout: float = 900,
    console: Console | None = None,
) -> SoakResult:
    """Run the soak in ``root``; the figures. The stack is stopped before it returns."""
    console = console or Console(stderr=True)
    code = root / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "trial.py").write_text(textwrap.dedent(TRIAL.format(metrics=metrics, pause=pause)))
    run_log = root / "runs.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"},
        "SOAK_RUN_LOG": str(run_log),
        "COLUMNS": "200",
    }
    up = Up(root / "data", new_ports(), env, root / "up.log")
    result = SoakResult(trials, kills)
    try:
        up.wait_for("Trialbus is up", timeout=120)
        console.print(
            f"stack up (data {up.data_dir}); {trials} trials × {metrics + 1} metrics at concurrency "
            f"{concurrency}; killing {', '.join(kills)} once each"
        )
        began = time.monotonic()
        experiment = asyncio.run(_run(up, code, result, trials, concurrency, kills, timeout, console))
        result.seconds = time.monotonic() - began
        asyncio.run(check(up, experiment, run_log, metrics, result))
    finally:
        began = time.monotonic()
        up.ctrl_c()
        try:
            result.stop_code = up.wait(60)
        except AssertionError:
            up.kill()
        result.stop_seconds = time.monotonic() - began
        if result.stop_code != 0:
            result.problems.append(f"`trialbus up` stopped with {result.stop_code}:\n{up.text()[-3000:]}")
    return result


async def _run(
    up: Up,
    code: Path,
    result: SoakResult,
    trials: int,
    concurrency: int,
    kills: tuple[str, ...],
    timeout: float,
    console: Console,
) -> str:
    """Create the experiment, kill the parts at their moments, wait for DONE; the experiment id."""
    config = {
        "experimentName": "soak",
        "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": concurrency,
        "maxTrialNumber": trials,
        "trainingService": {"platform": "local"},
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
        "tuner": {"name": "Random", "classArgs": {"seed": 7}},
    }
    async with AsyncClient(up.nats_url, request_timeout=5, **up.nats_auth) as client:
        experiment = await client.create_experiment(config)
        plan = [(part, trials * (i + 1) // (len(kills) + 2)) for i, part in enumerate(kills)]  # within 5/7 of it
        pending: tuple[Kill, float, int] | None = None
        deadline = time.monotonic() + timeout
        ended, last_change, last_ended = 0, time.monotonic(), -1
        while time.monotonic() < deadline:
            try:
                view = await client.get_experiment(experiment)
            except (TrialbusError, TimeoutError):  # the dispatcher or the broker is down for a moment
                await asyncio.sleep(0.2)
                continue
            counts = view.trial_counts
            ended = sum(n for status, n in counts.items() if status not in ("WAITING", "RUNNING"))
            if ended != last_ended:
                last_ended, last_change = ended, time.monotonic()
            if view.status.value != "RUNNING":
                break
            if pending is not None and up.back(pending[0].part, pending[2]):
                pending[0].back_after = time.monotonic() - pending[1]
                console.print(f"  {pending[0].part} back after {pending[0].back_after:.1f}s")
                pending = None
            if pending is None and plan and ended >= plan[0][1]:
                part, _ = plan.pop(0)
                killed = up.processes()[part]
                killed.kill()
                kill = Kill(part, ended)
                result.kills.append(kill)
                pending = (kill, time.monotonic(), killed.pid)
                console.print(f"  {ended}/{trials} ended: SIGKILL {part}")
            if time.monotonic() - last_change > 120:
                result.problems.append(f"no trial ended for 120 s at {ended}/{trials}: {counts}")
                break
            await asyncio.sleep(0.25)
        while pending is not None and time.monotonic() - pending[1] < 60:  # the last one killed comes back
            if up.back(pending[0].part, pending[2]):
                pending[0].back_after = time.monotonic() - pending[1]
                console.print(f"  {pending[0].part} back after {pending[0].back_after:.1f}s")
                pending = None
            await asyncio.sleep(0.1)
        for part, _ in plan:
            result.problems.append(f"{part} was never killed: the run ended first")
        return experiment


async def check(up: Up, experiment: str, run_log: Path, metrics: int, result: SoakResult) -> None:
    """What a user would check: the trials' ends, their runs, their metrics in the stream and the view."""
    async with AsyncClient(up.nats_url, request_timeout=30, **up.nats_auth) as client:
        states = await client.list_trials(experiment)
    result.submitted = len(states)
    result.lost = max(result.trials - len({t.parameter_id for t in states}), 0)
    for trial in states:
        if trial.status.value == "SUCCEEDED":
            result.succeeded += 1
        elif trial.status.terminal:
            result.ended_otherwise[trial.status.value] += 1
            result.problems.append(f"trial {trial.id} ended {trial.status.value}: {trial.message}")
        else:
            result.stuck += 1
            result.problems.append(f"trial {trial.id} still {trial.status.value}: {trial.message}")
    runs = Counter(line.split()[0] for line in run_log.read_text().splitlines()) if run_log.exists() else Counter()
    by_parameter = Counter(t.parameter_id for t in states)
    result.duplicated = sum(1 for n in runs.values() if n > 1) + sum(n - 1 for n in by_parameter.values() if n > 1)
    for trial_id in (t for t, n in runs.items() if n > 1):
        result.problems.append(f"trial {trial_id} ran {runs[trial_id]} times")

    stored: dict[tuple[str, str, int], list] = defaultdict(list)
    for record in await _stream_records(up, experiment):
        stored[(record.trial_id, record.type.value, record.sequence)].append(record.decoded())
    result.metrics_stored = sum(len(v) for v in stored.values())
    for trial in states:
        x = trial.parameters["x"]
        expected = {(trial.id, "PERIODICAL", i): x * (i + 1) for i in range(metrics)}
        expected[(trial.id, "FINAL", 0)] = x
        result.metrics_expected += len(expected)
        for key, value in expected.items():
            got = stored.get(key, [])
            result.metrics_lost += not got
            result.metrics_duplicated += max(len(got) - 1, 0)
            result.metrics_wrong += sum(v != value for v in got)
        if trial.status.value == "SUCCEEDED" and (trial.intermediate_count != metrics or trial.final_metric != x):
            result.views_wrong += 1
            result.problems.append(
                f"trial {trial.id}: the view has {trial.intermediate_count} intermediate results "
                f"and final {trial.final_metric}, it reported {metrics} and {x}"
            )
    known = {t.id for t in states}
    result.metrics_wrong += sum(len(v) for (trial_id, _, _), v in stored.items() if trial_id not in known)


async def _stream_records(up: Up, experiment: str) -> list[MetricRecord]:
    """Every record of the experiment in METRICS, duplicates included (no dedupe here)."""
    nc = await nats.connect(up.nats_url, **up.nats_auth)
    try:
        js = nc.jetstream()
        subject = f"metrics.{experiment}.>"
        info = await js.stream_info("METRICS", subjects_filter=subject)
        total = sum((info.state.subjects or {}).values())
        sub = await js.subscribe(subject, stream="METRICS", ordered_consumer=True)
        records = []
        for _ in range(total):  # messages: each one record, or a keeper's batch
            records.extend(records_of((await sub.next_msg(timeout=10)).data))
        await sub.unsubscribe()
        return records
    finally:
        await nc.close()


def report(result: SoakResult, console: Console) -> None:
    table = Table(
        title=f"soak: {result.trials} trials, {len(result.kills)} of {len(result.planned)} parts killed once each"
    )
    table.add_column("")
    table.add_column("figure", justify="right")
    rows = [
        ("trials succeeded", f"{result.succeeded} / {result.trials}"),
        ("trials ended otherwise", str(sum(result.ended_otherwise.values()))),
        ("trials lost", str(result.lost)),
        ("trials duplicated", str(result.duplicated)),
        ("trials stuck", str(result.stuck)),
        ("metric records stored / expected", f"{result.metrics_stored} / {result.metrics_expected}"),
        ("metric records lost", str(result.metrics_lost)),
        ("metric records duplicated", str(result.metrics_duplicated)),
        ("metric records wrong", str(result.metrics_wrong)),
        ("trial views wrong", str(result.views_wrong)),
        ("experiment time", f"{result.seconds:.1f} s"),
        ("trials per second", f"{result.trials / result.seconds:.1f}" if result.seconds else "-"),
        ("stop (Ctrl-C) time, exit code", f"{result.stop_seconds:.1f} s, {result.stop_code}"),
    ]
    rows += [
        (
            f"{k.part} killed at {k.at} ended, back after",
            f"{k.back_after:.1f} s" if k.back_after is not None else "never",
        )
        for k in result.kills
    ]
    print_verdict(table, rows, result.problems, result.ok(), console)


def print_verdict(table: Table, rows: list[tuple[str, str]], problems: list[str], ok: bool, console: Console) -> None:
    """A run's figures in ``table``, its first 20 problems, then PASS or FAIL (soak and failover alike)."""
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for problem in problems[:20]:
        console.print(f"[red]problem:[/] {problem}")
    console.print("[bold green]PASS[/]" if ok else "[bold red]FAIL[/]")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--metrics", type=int, default=20, help="intermediate results per trial (plus one final)")
    parser.add_argument("--kill", default=",".join(KILLS), help="parts to SIGKILL once each, comma-separated")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    console = Console()
    root = Path(tempfile.mkdtemp(prefix="trialbus-soak-"))
    kills = tuple(k for k in args.kill.split(",") if k)
    result = soak(root, args.trials, args.concurrency, args.metrics, kills=kills, timeout=args.timeout, console=console)
    report(result, console)
    console.print(f"[dim]logs in {root / 'data' / 'logs'}[/]")
    raise SystemExit(0 if result.ok() else 1)


if __name__ == "__main__":
    main()
