"""The tuner service driving experiments of no-op trials: how fast it keeps the slots full.

For each tuner, one experiment of ``count`` no-op trials at ``concurrency`` over a 5-parameter
NNI search space. Figures: trials per second from creation to DONE, and the refill gap: a trial
ends → the tuner's next trial is submitted (the end reaches the tuner through the ``trials``
bucket, the tuner proposes, the dispatcher takes the submit), read from the trials' own times.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from trialbus.client import AsyncClient

SPACE = {
    "lr": {"_type": "loguniform", "_value": [1e-5, 0.1]},
    "batch": {"_type": "choice", "_value": [16, 32, 64, 128]},
    "dropout": {"_type": "uniform", "_value": [0, 0.5]},
    "units": {"_type": "quniform", "_value": [32, 512, 32]},
    "layers": {"_type": "randint", "_value": [1, 6]},
}


@dataclass
class TunerFigures:
    rate: float
    refill: list[float]  # seconds from a trial's end to the next submit


async def tuner_rate(nats_url: str, command: str, code: Path, tuner: str, concurrency: int, count: int) -> TunerFigures:
    async with AsyncClient(nats_url) as client:
        begin = time.perf_counter()
        experiment = await client.create_experiment(
            {
                "trialCommand": command,
                "trialCodeDirectory": str(code),
                "trialConcurrency": concurrency,
                "maxTrialNumber": count,
                "searchSpace": SPACE,
                "tuner": {"name": tuner},
                "trainingService": {"platform": "local"},
            }
        )
        while (await client.get_experiment(experiment)).status.value == "RUNNING":
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - begin
        trials = sorted(await client.list_trials(experiment), key=lambda t: t.sequence_id)
    ends = sorted(t.end_time for t in trials if t.end_time)
    # Trial n (n >= concurrency) took the slot the (n - concurrency + 1)-th end freed.
    refill = [
        (t.submit_time - ends[t.sequence_id - concurrency]).total_seconds()
        for t in trials[concurrency:]
        if t.sequence_id - concurrency < len(ends)
    ]
    return TunerFigures(count / elapsed, [max(r, 0.0) for r in refill])
