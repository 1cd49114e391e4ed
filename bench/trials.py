"""Trial throughput and latency against the spawn-only rate of the same trial command.

For each concurrency the tuner keeps exactly that many trials in flight (a new submit as
soon as one ends), as a real tuner does, so submit→RUNNING measures dispatch, not queueing.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trialbus.client import AsyncClient

NOOP_TRIAL = "import nni\nnni.get_next_parameter()\nnni.report_final_result(1.0)\n"


@dataclass
class TrialFigures:
    concurrency: int
    trials: int
    rate: float
    spawn_rate: float
    to_running: list[float]
    to_final: list[float]

    @property
    def ratio(self) -> float:
        return self.rate / self.spawn_rate


def write_noop(code_dir: Path) -> str:
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "noop.py").write_text(NOOP_TRIAL)
    return f"{sys.executable} noop.py"


def spawn_rate(command: str, cwd: Path, env: dict[str, str], concurrency: int, count: int) -> float:
    """Trials per second when the machine merely spawns the trial command, `concurrency` at a time."""
    argv = ["/bin/sh", "-c", f"exec {command} >/dev/null 2>&1"]  # trials' output goes to files, not a terminal
    os.chdir(cwd)
    running: set[int] = set()
    started = done = 0
    begin = time.perf_counter()
    while done < count:
        while started < count and len(running) < concurrency:
            running.add(os.posix_spawn(argv[0], argv, env))
            started += 1
        pid, _ = os.waitpid(-1, 0)
        if pid in running:
            running.discard(pid)
            done += 1
    return count / (time.perf_counter() - begin)


async def trial_rate(
    nats_url: str, command: str, code_dir: Path, concurrency: int, count: int, training_service: dict | None = None
) -> TrialFigures:
    """Run `count` no-op trials through the stack, `concurrency` in flight (local by default)."""
    async with AsyncClient(nats_url) as client:
        experiment = await client.create_experiment(
            {
                "experimentName": f"bench-c{concurrency}",
                "trialCommand": command,
                "trialCodeDirectory": str(code_dir),
                "trialConcurrency": concurrency,
                "maxTrialNumber": count,
                "trainingService": training_service or {"platform": "local"},
            }
        )
        submitted: dict[str, float] = {}
        final_at: dict[str, float] = {}

        async def one() -> None:
            start = time.time()
            trial = await client.submit_trial(experiment, {"i": len(submitted)})
            submitted[trial.id] = start
            await client.wait_final(trial.id, timeout=120)
            final_at[trial.id] = time.time()
            # The slot frees when the trial has ended (its SUCCEEDED event), which may come
            # just after its final metric: submit the next one then, as NNI does.
            await client.wait_trial(trial.id, timeout=120)

        async def lane(n: int) -> None:
            for _ in range(n):
                await one()

        begin = time.perf_counter()
        lanes = [count // concurrency + (1 if i < count % concurrency else 0) for i in range(concurrency)]
        await asyncio.gather(*(lane(n) for n in lanes))
        elapsed = time.perf_counter() - begin
        # RUNNING times from the events' own timestamps (set by the adapter when the trial
        # started), read after the run so that no extra consumer competes during it.
        running_at = await _running_times(client, experiment, len(submitted))
        return TrialFigures(
            concurrency=concurrency,
            trials=count,
            rate=count / elapsed,
            spawn_rate=0.0,
            to_running=sorted(running_at[t] - submitted[t] for t in submitted if t in running_at),
            to_final=sorted(final_at[t] - submitted[t] for t in submitted),
        )


async def _running_times(client: AsyncClient, experiment: str, count: int) -> dict[str, float]:
    running: dict[str, float] = {}

    async def read() -> None:
        async for event in client.events(experiment):
            if event.status == "RUNNING":
                running[event.trial_id] = event.time.timestamp()
                if len(running) == count:
                    return

    await asyncio.wait_for(read(), 30)
    return running


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1] if len(values) > 1 else values[0]
