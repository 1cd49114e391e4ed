"""Metric records per second from keeper-shaped HTTP batches, through the gateway, to a tuner.

Several concurrent posters send batches exactly as trial keepers do; the rate is counted
where a tuner sees it: records arriving through the client's ``metrics()`` iterator.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from services.common.tokens import trial_token
from trialbus import __version__
from trialbus.client import AsyncClient


async def metric_rate(
    nats_url: str,
    gateway_url: str,
    secret: str,
    experiment: str,
    trials: int = 8,
    per_trial: int = 5000,
    batch: int = 500,
) -> float:
    total = trials * per_trial
    seen = 0
    done = asyncio.Event()

    async with AsyncClient(nats_url) as client:

        async def tuner() -> None:
            nonlocal seen
            async for _ in client.metrics(experiment):
                seen += 1
                if seen >= total:
                    done.set()
                    return

        reader = asyncio.create_task(tuner())
        await asyncio.sleep(0.3)

        def bodies(trial: str) -> list[bytes]:
            # Built before the clock starts: a keeper forwards lines the trial already wrote.
            return [
                json.dumps(
                    {
                        "experimentId": experiment,
                        "records": [
                            json.dumps(
                                {
                                    "parameter_id": 0,
                                    "trial_job_id": trial,
                                    "type": "PERIODICAL",
                                    "sequence": i,
                                    "value": json.dumps(i * 0.5),
                                }
                            )
                            for i in range(start, min(start + batch, per_trial))
                        ],
                    }
                ).encode()
                for start in range(0, per_trial, batch)
            ]

        # Trial ids unique per run: the metric dedupe id is <trial>:<type>:<sequence>.
        prepared = {f"{experiment}{t}": bodies(f"{experiment}{t}") for t in range(trials)}

        async def keeper(http: httpx.AsyncClient, trial: str) -> None:
            headers = {
                "Authorization": f"Bearer {trial_token(secret, experiment, trial)}",
                "X-Trialbus-Keeper-Version": __version__,
                "Content-Type": "application/json",
            }
            for body in prepared[trial]:
                answer = await http.post(f"{gateway_url}/api/v1/trials/{trial}/metrics", headers=headers, content=body)
                answer.raise_for_status()

        begin = time.perf_counter()
        async with httpx.AsyncClient(timeout=30) as http:
            await asyncio.gather(*(keeper(http, trial) for trial in prepared))
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - begin
        reader.cancel()
    return total / elapsed
