"""``make failover`` / ``python -m bench.failover``: a NATS node dies under a running experiment
and nothing is lost, as production's 3-node JetStream cluster promises.

Runs ``trialbus up --cluster 3`` (three nats-servers, every stream and bucket at 3 replicas, the
real supervisor and services, free ports, a fresh data dir), then an experiment driven by the
tuner service: ``--trials`` trials (120) at ``--concurrency`` (8), each reporting ``--metrics``
intermediate results (20) and a final one. ``--kills`` times (2), spread over the run, the node
that leads the METRICS stream at that moment is SIGKILLed and kept down ``--down`` seconds (10,
longer than an election; ``trialbus up`` is held still meanwhile, else it would restart the node
in half a second), then ``trialbus up`` restarts it on its store and it rejoins. Then it checks what a user would, as
``make soak`` does: every trial succeeded and ran once, every metric is in the METRICS stream
exactly once and in the dispatcher's view, no service was restarted. And it prints the pause:
how long until METRICS had a new leader, and the longest gap between consecutive metrics (and
between trial events), as the streams stored them, from each kill until 5 s after the node was
back, next to the longest gaps elsewhere in the run. Exit 0 only when nothing was lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import textwrap
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nats
from rich.console import Console
from rich.table import Table

from bench.soak import TRIAL, SoakResult, check, print_verdict
from tests.fixtures.up import Up, new_ports
from trialbus.client import AsyncClient, TrialbusError

#: The stream whose leader is killed: the one every metric goes through.
STREAM = "METRICS"
#: Seconds after a killed node is back that still count as its pause (leaders may move again).
AFTER = 5.0


@dataclass
class NodeKill:
    """One leader's death."""

    node: str
    #: Trials ended when it was killed.
    at: int
    #: Wall-clock time of the SIGKILL (seconds since the epoch, as the streams' timestamps).
    killed: float
    #: Seconds from the kill until METRICS answered with a leader again (None: never).
    new_leader_after: float | None = None
    new_leader: str | None = None
    #: Seconds from the kill until the restarted node was ready again (caught up; None: never).
    back_after: float | None = None
    #: The longest gap between consecutive metrics stored in METRICS, and between consecutive trial
    #: events stored in EVENTS, from the kill until 5 s after the node was back.
    metrics_pause: float | None = None
    events_pause: float | None = None


@dataclass
class FailoverResult:
    """What ``make soak`` counts, and the kills with their pauses."""

    soak: SoakResult
    planned: int = 0
    kills: list[NodeKill] = field(default_factory=list)
    #: The same gaps away from every kill (the run's normal pace).
    metrics_gap: float = 0.0
    events_gap: float = 0.0
    #: Restarts of each service part (every one should be 0).
    service_restarts: dict[str, int] = field(default_factory=dict)

    @property
    def received(self) -> int:
        return self.soak.metrics_stored

    @property
    def lost(self) -> int:
        return self.soak.metrics_lost + self.soak.lost

    @property
    def duplicated(self) -> int:
        return self.soak.metrics_duplicated + self.soak.duplicated

    def ok(self) -> bool:
        kills_done = len(self.kills) == self.planned and all(k.back_after is not None for k in self.kills)
        return self.soak.ok() and kills_done and not any(self.service_restarts.values())


def failover(
    root: Path,
    trials: int = 120,
    concurrency: int = 8,
    metrics: int = 20,
    pause: float = 0.05,
    kills: int = 2,
    down: float = 10.0,
    cluster: int = 3,
    timeout: float = 600,
    console: Console | None = None,
) -> FailoverResult:
    """Run it in ``root``; the figures. The stack is stopped before it returns."""
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
    up = Up(root / "data", new_ports(), env, root / "up.log", ["--cluster", str(cluster)])
    result = FailoverResult(SoakResult(trials), planned=kills)
    try:
        up.wait_for("Trialbus is up", timeout=120)
        console.print(
            f"stack up with {cluster} nats-servers (data {up.data_dir}); {trials} trials × {metrics + 1} "
            f"metrics at concurrency {concurrency}; killing the {STREAM} leader {kills} times, "
            f"{down:g} s down each"
        )
        began = time.monotonic()
        experiment = asyncio.run(_run(up, code, result, trials, concurrency, kills, down, timeout, console))
        result.soak.seconds = time.monotonic() - began
        asyncio.run(check(up, experiment, run_log, metrics, result.soak))
        asyncio.run(_pauses(up, experiment, result))
        result.service_restarts = {
            p["name"]: p["restarts"] for p in up.state()["parts"] if not p["name"].startswith("nats-server")
        }
    finally:
        began = time.monotonic()
        up.ctrl_c()
        try:
            result.soak.stop_code = up.wait(60)
        except AssertionError:
            up.kill()
        result.soak.stop_seconds = time.monotonic() - began
        if result.soak.stop_code != 0:
            result.soak.problems.append(f"`trialbus up` stopped with {result.soak.stop_code}:\n{up.text()[-3000:]}")
    return result


async def _run(
    up: Up,
    code: Path,
    result: FailoverResult,
    trials: int,
    concurrency: int,
    kills: int,
    down: float,
    timeout: float,
    console: Console,
) -> str:
    """Create the experiment, kill the leader at its moments, wait for DONE; the experiment id."""
    config = {
        "experimentName": "failover",
        "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": concurrency,
        "maxTrialNumber": trials,
        "trainingService": {"platform": "local"},
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
        "tuner": {"name": "Random", "classArgs": {"seed": 7}},
    }
    async with AsyncClient(up.nats_urls, request_timeout=5, **up.nats_auth) as client:
        experiment = await client.create_experiment(config)
        plan = [trials * (i + 1) // (kills + 1) for i in range(kills)]
        deadline = time.monotonic() + timeout
        last_change, last_ended = time.monotonic(), -1
        while time.monotonic() < deadline:
            try:
                view = await client.get_experiment(experiment)
            except (TrialbusError, TimeoutError):  # a moment without a leader
                await asyncio.sleep(0.2)
                continue
            ended = sum(n for status, n in view.trial_counts.items() if status not in ("WAITING", "RUNNING"))
            if ended != last_ended:
                last_ended, last_change = ended, time.monotonic()
            if view.status.value != "RUNNING":
                break
            if plan and ended >= plan[0]:
                plan.pop(0)
                kill = await kill_leader(up, client, ended, down, console)
                if kill is not None:
                    result.kills.append(kill)
            if time.monotonic() - last_change > 120:
                result.soak.problems.append(f"no trial ended for 120 s at {ended}/{trials}: {view.trial_counts}")
                break
            await asyncio.sleep(0.25)
        if plan:
            result.soak.problems.append(f"{len(plan)} kills never happened: the run ended first")
        return experiment


async def leader(client: AsyncClient, timeout: float = 1.0) -> str | None:
    """The server that leads METRICS now; None while it has none (or does not answer)."""
    try:
        info = await asyncio.wait_for(client.js.stream_info(STREAM), timeout)
    except (nats.errors.Error, TimeoutError, OSError):
        return None
    return info.cluster.leader if info.cluster else None


async def kill_leader(up: Up, client: AsyncClient, ended: int, down: float, console: Console) -> NodeKill | None:
    """SIGKILL the node leading METRICS, keep it down ``down`` seconds, then wait until it is back
    (restarted by ``trialbus up``, caught up) and METRICS has a leader again."""
    node = await leader(client, 5)
    if node is None:
        console.print("  [yellow]METRICS has no leader to kill[/]")
        return None
    process = up.processes()[node]
    began = time.monotonic()
    with up.held():  # the supervisor, still: the node stays down
        process.kill()
        kill = NodeKill(node, ended, time.time())
        console.print(f"  {ended} trials ended: SIGKILL {node} (pid {process.pid}), leader of {STREAM}")
        while time.monotonic() - began < down:
            await _new_leader(client, kill, console)
    while time.monotonic() - began < down + 60 and (kill.back_after is None or kill.new_leader is None):
        if kill.back_after is None and up.back(node, process.pid):
            kill.back_after = time.time() - kill.killed
            console.print(f"  {node} back (restarted, caught up) {kill.back_after:.1f} s after the kill")
        await _new_leader(client, kill, console)
    return kill


async def _new_leader(client: AsyncClient, kill: NodeKill, console: Console) -> None:
    """Note when METRICS first answers with a leader after the kill: another node, or the killed
    one once it is back (a leader is elected for a new term either way)."""
    if kill.new_leader is not None:
        await asyncio.sleep(0.1)
        return
    found = await leader(client, 0.5)
    if found is None or (found == kill.node and kill.back_after is None):
        await asyncio.sleep(0.05)
        return
    kill.new_leader, kill.new_leader_after = found, time.time() - kill.killed
    console.print(f"  {STREAM} led by {found} {kill.new_leader_after:.1f} s after the kill")


async def _pauses(up: Up, experiment: str, result: FailoverResult) -> None:
    """The longest gaps between consecutive metrics, and trial events, around each kill and away from them."""
    async with AsyncClient(up.nats_urls, request_timeout=30, **up.nats_auth) as client:
        metrics = await stored_times(client, "METRICS", f"metrics.{experiment}.>")
        events = await stored_times(client, "EVENTS", f"events.{experiment}.>")
    ends = [k.killed for k in result.kills[1:]] + [float("inf")]  # a window ends at the next kill
    windows = [
        (k.killed, min(k.killed + (k.back_after or 60.0) + AFTER, end))
        for k, end in zip(result.kills, ends, strict=True)
    ]
    for kill, window in zip(result.kills, windows, strict=True):
        kill.metrics_pause, kill.events_pause = longest_gap(metrics, [window]), longest_gap(events, [window])
    result.metrics_gap = longest_gap(metrics, windows, outside=True)
    result.events_gap = longest_gap(events, windows, outside=True)


def longest_gap(times: list[float], windows: Iterable[tuple[float, float]], outside: bool = False) -> float:
    """The longest gap between consecutive ``times`` that overlaps one of ``windows`` (none of
    them, with ``outside``)."""
    windows = list(windows)
    times = sorted(times)
    longest = 0.0
    for before, after in zip(times, times[1:], strict=False):
        overlaps = any(before <= end and after >= start for start, end in windows)
        if overlaps != outside:
            longest = max(longest, after - before)
    return longest


async def stored_times(client: AsyncClient, stream: str, subject: str) -> list[float]:
    """When the stream stored each of its messages on ``subject`` (seconds since the epoch)."""
    info = await client.js.stream_info(stream, subjects_filter=subject)
    total = sum((info.state.subjects or {}).values())
    sub = await client.js.subscribe(subject, stream=stream, ordered_consumer=True)
    times: list[float] = []
    try:
        while len(times) < total:
            msg = await sub.next_msg(timeout=10)
            stamp: datetime = msg.metadata.timestamp
            times.append(stamp.timestamp())
    finally:
        await sub.unsubscribe()
    return times


def report(result: FailoverResult, console: Console) -> None:
    soak = result.soak
    table = Table(
        title=f"failover: {soak.trials} trials, the {STREAM} leader killed {len(result.kills)} of "
        f"{result.planned} times"
    )
    table.add_column("")
    table.add_column("figure", justify="right")
    rows = [
        ("trials succeeded", f"{soak.succeeded} / {soak.trials}"),
        ("trials lost / duplicated / stuck", f"{soak.lost} / {soak.duplicated} / {soak.stuck}"),
        ("metrics received / expected", f"{soak.metrics_stored} / {soak.metrics_expected}"),
        ("metrics lost", str(soak.metrics_lost)),
        ("metrics duplicated", str(soak.metrics_duplicated)),
        ("metrics wrong, trial views wrong", f"{soak.metrics_wrong}, {soak.views_wrong}"),
        ("service restarts", str(sum(result.service_restarts.values()))),
        ("experiment time", f"{soak.seconds:.1f} s"),
        (
            "longest gap between metrics / trial events away from the kills",
            f"{result.metrics_gap:.2f} s / {result.events_gap:.2f} s",
        ),
    ]
    for k in result.kills:
        rows += [
            (
                f"kill of {k.node} at {k.at} ended: new {STREAM} leader after",
                f"{k.new_leader_after:.2f} s ({k.new_leader})" if k.new_leader_after is not None else "never",
            ),
            (
                "  longest gap between metrics / trial events (the pause)",
                f"{k.metrics_pause:.2f} s / {k.events_pause:.2f} s" if k.metrics_pause is not None else "-",
            ),
            ("  node back (restarted, caught up) after", f"{k.back_after:.1f} s" if k.back_after else "never"),
        ]
    rows.append(("stop (Ctrl-C) time, exit code", f"{soak.stop_seconds:.1f} s, {soak.stop_code}"))
    print_verdict(table, rows, soak.problems, result.ok(), console)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--metrics", type=int, default=20, help="intermediate results per trial (plus one final)")
    parser.add_argument("--kills", type=int, default=2, help="times the METRICS leader's node is SIGKILLed")
    parser.add_argument("--down", type=float, default=10.0, help="seconds each killed node stays down")
    parser.add_argument("--cluster", type=int, default=3, help="nats-servers (3 or 5)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    console = Console()
    root = Path(tempfile.mkdtemp(prefix="trialbus-failover-"))
    result = failover(
        root,
        args.trials,
        args.concurrency,
        args.metrics,
        kills=args.kills,
        down=args.down,
        cluster=args.cluster,
        timeout=args.timeout,
        console=console,
    )
    report(result, console)
    console.print(f"[dim]logs in {root / 'data' / 'logs'}[/]")
    raise SystemExit(0 if result.ok() and result.lost == result.duplicated == 0 else 1)


if __name__ == "__main__":
    main()
