"""GPU hand-off: from a trial's end (its GPU frees) to the next waiting trial RUNNING there.

One GPU (the test suite's fake ``nvidia-smi``, so the figure is the same on any host),
``trialGpuNumber: 1``, two trials in flight: one runs, the other waits at the adapter for
the GPU. The gap is the next trial's ``startTime`` minus the previous one's ``endTime``,
both stamped on the adapter's host. NNI polls its GPU scheduler every 5 s.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.fixtures.gpus import install_fake_nvidia_smi
from trialbus.client import AsyncClient

SLEEPER = "import nni, time\nnni.get_next_parameter()\ntime.sleep(0.15)\nnni.report_final_result(1.0)\n"


def use_fake_gpu(directory: Path) -> None:
    """Make the stack about to start see one fake GPU (its services inherit this environment)."""
    env = install_fake_nvidia_smi(directory, [{"name": "bench GPU", "memoryTotalMib": 16384}])
    os.environ.update(env, TRIALBUS_GPU_SOURCE="nvidia-smi")


async def gpu_handoff(nats_url: str, python: str, code_dir: Path, trials: int = 20) -> list[float]:
    """Seconds from each trial's end to the next trial's start on the one GPU."""
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "sleeper.py").write_text(SLEEPER)
    async with AsyncClient(nats_url) as client:
        experiment = await client.create_experiment(
            {
                "experimentName": "bench-gpu-handoff",
                "trialCommand": f"{python} sleeper.py",
                "trialCodeDirectory": str(code_dir),
                "trialConcurrency": 2,
                "trialGpuNumber": 1,
                "trainingService": {"platform": "local", "useActiveGpu": True},
            }
        )
        ids = [(await client.submit_trial(experiment, {"i": i})).id for i in range(trials)]
        await asyncio.gather(*(client.wait_trial(t, timeout=120) for t in ids))
        ended = await asyncio.gather(*(client.get_trial(t) for t in ids))
    spans = []  # (start, end) of each trial, by start
    for trial in ended:
        if trial.start_time is None or trial.end_time is None:
            raise RuntimeError(f"trial {trial.id} ended without its start and end times")
        spans.append((trial.start_time, trial.end_time))
    spans.sort(key=lambda span: span[0])
    return sorted((after[0] - before[1]).total_seconds() for before, after in zip(spans, spans[1:], strict=False))
