"""``python -m bench [trials|metrics|gpus|remote…]``: start a private stack on free ports and
print the figures (all of them without arguments).

Prints, for no-op trials at concurrency 1, 4 and 16: submit→RUNNING and submit→final
latency (p50/p99), trials per second next to the spawn-only rate of the same command
measured in the same run, and their ratio; then metric records per second through the
gateway to a subscribed tuner; and the GPU hand-off (a GPU frees → the next waiting trial
RUNNING); and the remote adapter over loopback SSH (submit→RUNNING once warm, trials per
second over two machines); and the openpai adapter against the OpenPAI emulator (trials per
second, one job each, and in reuse mode); and the frameworkcontroller adapter against the
Kubernetes emulator (trials per second, one Framework each); and the tuner service driving
no-op experiments (trials per second, trial end → next submit); and warm-started trials beside
cold ones and NNI 3.0 (``bench.warm``: NNI's scikit-learn example, start overhead, no-op rate);
and first, before the stack starts, ``trialbus --help`` next to a bare interpreter (``bench.cli``),
then NNI's scikit-learn example as a user times ``trialbus experiment run`` on a fresh stack of
its own, first and second experiment, beside NNI 3.0 (``bench.sklearn``); and how long the
dispatcher's decisions take where teams share a platform (``bench.shares``, no stack).
Spawn-only is measured right before and right after each concurrency's trials (the host's speed
drifts), and the ratio uses their mean.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.cli import report, start_times
from bench.frameworkcontroller import kubernetes_cluster
from bench.gpus import gpu_handoff, use_fake_gpu
from bench.metrics import metric_rate
from bench.openpai import openpai_service
from bench.remote import ssh_machines
from bench.sklearn import sklearn_figure
from bench.trials import percentile, spawn_rate, trial_rate, write_noop
from bench.tuner import tuner_rate
from bench.warm import warm_start
from services.trial_keeper import SHIM_PATH
from trialbus.stack import Stack, StackOptions
from trialbus.stack.processes import free_port

COUNTS = {1: 40, 4: 80, 16: 160}
#: What ``python -m bench [part…]`` can measure; all of them without arguments.
PARTS = (
    "cli",
    "shares",
    "trials",
    "metrics",
    "gpus",
    "remote",
    "openpai",
    "frameworkcontroller",
    "tuner",
    "warm",
    "sklearn",
)


def main() -> None:
    console = Console()
    parts = set(sys.argv[1:]) or set(PARTS)
    if "cli" in parts:  # before the stack starts: its processes would slow both commands
        console.print(report(start_times()))
        if parts == {"cli"}:
            return
    if "shares" in parts:  # the dispatcher's sharing decisions alone (bench.shares): no stack
        from bench import shares

        shares.main([])
        if not parts - {"cli", "shares"}:
            return
    if "sklearn" in parts:  # on a fresh stack of its own (bench.sklearn), before the bench's starts
        sklearn_figure(console, Path(tempfile.mkdtemp(prefix="trialbus-bench-sklearn-")))
        if not parts - {"cli", "sklearn"}:
            return
    root = Path(tempfile.mkdtemp(prefix="trialbus-bench-"))
    options = StackOptions(
        data_dir=root / "data",
        nats_port=free_port(),
        api_port=free_port(),
        gateway_port=free_port(),
        webui_port=free_port(),
        stop_grace=5,
    )
    stack = Stack(options, console)
    code = root / "code"
    command = write_noop(code)
    console.print(
        f"[bold]Trialbus bench[/] on {os.cpu_count()} cores, Python {sys.version.split()[0]}; work dir {root}"
    )
    use_fake_gpu(root / "gpu")
    with ssh_machines(root) as machines, kubernetes_cluster(root, command) as cluster:
        stack.start()
        os.environ["TRIALBUS_DATA_DIR"] = str(stack.data_dir)  # clients here find its client.json
        try:
            run(console, options, stack, root, code, command, machines, cluster)
        finally:
            stack.stop()


def run(
    console: Console,
    options: StackOptions,
    stack: Stack,
    root: Path,
    code: Path,
    command: str,
    machines: list[dict] | None,
    cluster: dict,
) -> None:
    """Every figure asked for on the command line (all by default), printed as it is measured."""
    parts = set(sys.argv[1:]) or set(PARTS)
    if "trials" in parts:
        local_trials(console, options, code, command)
    if "metrics" in parts:
        secret = stack.credentials.trial_secret
        rate = asyncio.run(
            metric_rate(options.nats_url, f"http://127.0.0.1:{options.gateway_port}", secret, "benchmetrics")
        )
        console.print(f"metric records through the gateway to a subscribed tuner: [bold]{rate:,.0f}[/] records/s")
    if "gpus" in parts:
        gaps = [gap * 1000 for gap in asyncio.run(gpu_handoff(options.nats_url, sys.executable, root / "gpu-code"))]
        console.print(
            f"GPU hand-off (a trial ends → the next waiting trial RUNNING on its GPU), {len(gaps)} hand-offs: "
            f"p50 [bold]{percentile(gaps, 50):.1f}[/] ms, p99 {percentile(gaps, 99):.1f} ms, max {max(gaps):.1f} ms"
        )
    if "remote" in parts:
        remote(console, options.nats_url, code, machines)
    if "openpai" in parts:
        with openpai_service(root) as service:
            for mode, reuse, count in (("one job per trial", False, 40), ("reuse mode, 8 environments", True, 200)):
                figures = asyncio.run(
                    trial_rate(
                        options.nats_url,
                        "python3 noop.py",
                        code,
                        8,
                        count,
                        {**service, "trialGpuNumber": 0, "reuseMode": reuse},
                    )
                )
                console.print(
                    f"openpai (emulated cluster, {mode}), concurrency 8, {count} trials: [bold]{figures.rate:.1f}[/] "
                    f"trials/s (submit→RUNNING p50 {percentile([x * 1000 for x in figures.to_running], 50):.0f} ms)"
                )

    if "frameworkcontroller" in parts:
        figures = asyncio.run(trial_rate(options.nats_url, command, code, 8, 40, cluster))
        console.print(
            f"frameworkcontroller (emulated cluster, one Framework per trial), concurrency 8, 40 trials: "
            f"[bold]{figures.rate:.1f}[/] trials/s "
            f"(submit→RUNNING p50 {percentile([x * 1000 for x in figures.to_running], 50):.0f} ms)"
        )
    if "tuner" in parts:
        for tuner in ("Random", "TPE"):
            tuned = asyncio.run(tuner_rate(options.nats_url, command, code, tuner, 8, 200))
            refill = [x * 1000 for x in tuned.refill]
            console.print(
                f"tuner service, {tuner}, concurrency 8, 200 no-op trials: [bold]{tuned.rate:.1f}[/] trials/s; "
                f"a trial ends → the next submitted p50 [bold]{percentile(refill, 50):.1f}[/] ms, "
                f"p99 {percentile(refill, 99):.1f} ms"
            )
    if "warm" in parts:
        services = {part.name: part.proc.pid for part in stack.parts if part.proc is not None}
        warm_start(console, options.nats_url, stack.data_dir, root / "warm", services=services)


def local_trials(console: Console, options: StackOptions, code: Path, command: str) -> None:
    """No-op trials on the local adapter at each concurrency, next to spawn-only."""
    table = Table(title="no-op trials (one final metric each)")
    for column in (
        "concurrency",
        "trials",
        "submit→RUNNING p50/p99 ms",
        "submit→final p50/p99 ms",
        "trials/s",
        "spawn-only/s",
        "ratio",
    ):
        table.add_column(column, justify="right")
    spawn_env = {**os.environ, "PYTHONPATH": str(SHIM_PATH)}
    for concurrency, count in COUNTS.items():
        # The host's speed drifts: spawn-only is measured just before and just after the
        # trials, and the ratio uses the mean of the two.
        before = spawn_rate(command, code, spawn_env, concurrency, count)
        figures = asyncio.run(trial_rate(options.nats_url, command, code, concurrency, count))
        figures.spawn_rate = (before + spawn_rate(command, code, spawn_env, concurrency, count)) / 2
        run_ms = [x * 1000 for x in figures.to_running]
        fin_ms = [x * 1000 for x in figures.to_final]
        table.add_row(
            str(concurrency),
            str(count),
            f"{percentile(run_ms, 50):.1f} / {percentile(run_ms, 99):.1f}",
            f"{percentile(fin_ms, 50):.1f} / {percentile(fin_ms, 99):.1f}",
            f"{figures.rate:.1f}",
            f"{figures.spawn_rate:.1f}",
            f"{figures.ratio:.2f}",
        )
        console.print(
            f"  concurrency {concurrency}: {figures.rate:.1f} trials/s "
            f"(spawn-only {figures.spawn_rate:.1f}/s, ratio {figures.ratio:.2f})"
        )
    console.print(table)


def remote(console: Console, nats_url: str, code: Path, machines: list[dict] | None) -> None:
    """submit→RUNNING on a warm SSH machine, and trials/s over two machines (remote adapter)."""
    if machines is None:
        console.print("remote adapter: [yellow]skipped[/] (no sshd: apt-get install openssh-server)")
        return
    command = "python3 noop.py"  # the machine's own python3
    one = {"platform": "remote", "machineList": machines[:1]}
    both = {"platform": "remote", "machineList": machines}
    asyncio.run(trial_rate(nats_url, command, code, 2, 4, both))  # warm-up: connections, files, code
    warm = asyncio.run(trial_rate(nats_url, command, code, 1, 30, one))
    run_ms = [x * 1000 for x in warm.to_running]
    console.print(
        f"remote, one machine over loopback SSH, warm: submit→RUNNING p50 [bold]{percentile(run_ms, 50):.1f}[/] ms, "
        f"p99 {percentile(run_ms, 99):.1f} ms ({warm.trials} trials, one at a time)"
    )
    spread = asyncio.run(trial_rate(nats_url, command, code, 4, 60, both))
    console.print(
        f"remote, two machines, concurrency 4: [bold]{spread.rate:.1f}[/] trials/s "
        f"(submit→RUNNING p50 {percentile([x * 1000 for x in spread.to_running], 50):.1f} ms)"
    )


if __name__ == "__main__":
    main()
