"""Metric records at scale (``make bench-scale``, issue 23): keepers' batches through the gateway to a
subscribed tuner, as many records a second as the stack takes.

``posters`` processes stand in for trial keepers: each POSTs its trials' records to the gateway
as a keeper does (batches of 500 ``NNISDK``-style records, the trial's token, the keeper's
version header; bodies built before the clock starts, as a keeper forwards lines the trial has
written), one request at a time per trial. The tuner is ``AsyncClient.metrics(experiment)`` in
this process: the per-record API a tuner uses, each record once. The rate is records seen by it
over the time from the first POST to the last record it saw. The dispatcher folds every record
into its trials' state meanwhile (it is running), so what is measured is the whole stack's rate.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event, Semaphore

import httpx

from services.common.tokens import trial_token
from trialbus import __version__
from trialbus.client import AsyncClient

BATCH = 500  # records per POST: what a keeper sends at most (trial_keeper.MAX_BATCH)


@dataclass
class MetricFigures:
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def bodies(experiment: str, trial: str, count: int) -> list[bytes]:
    """The request bodies a keeper sends for ``count`` intermediate results of ``trial``."""
    lines = [
        json.dumps(
            {
                "parameter_id": 0,
                "trial_job_id": trial,
                "type": "PERIODICAL",
                "sequence": i,
                "value": json.dumps(i * 0.5),
            }
        )
        for i in range(count)
    ]
    return [
        json.dumps({"experimentId": experiment, "records": lines[i : i + BATCH]}).encode()
        for i in range(0, count, BATCH)
    ]


def _post(
    gateway: str, secret: str, experiment: str, trials: list[str], per_trial: int, ready: Semaphore, go: Event
) -> None:
    """One poster process: its trials' records, a trial's batches in order (as its keeper sends them)."""
    prepared = [(trial, bodies(experiment, trial, per_trial)) for trial in trials]
    ready.release()
    go.wait()
    with httpx.Client(base_url=gateway, timeout=60) as http:
        for trial, batches in prepared:
            headers = {
                "Authorization": f"Bearer {trial_token(secret, experiment, trial)}",
                "X-Trialbus-Keeper-Version": __version__,
                "Content-Type": "application/json",
            }
            for body in batches:
                http.post(f"/api/v1/trials/{trial}/metrics", content=body, headers=headers).raise_for_status()


async def _count(nats_url: str, experiment: str, total: int, started: asyncio.Event) -> float:
    """Read the experiment's records as a tuner does until ``total`` arrived; when the last did."""
    seen = 0
    async with AsyncClient(nats_url) as client:
        records = client.metrics(experiment)
        started.set()
        async for _ in records:
            seen += 1
            if seen >= total:
                break
        await records.aclose()
    return time.perf_counter()


def metric_rate(
    nats_url: str, gateway: str, secret: str, experiment: str, trials: list[str], per_trial: int, posters: int = 4
) -> MetricFigures:
    """``per_trial`` records for each of ``trials`` (ids of the experiment's trials: the dispatcher
    folds them into those trials), posted by ``posters`` processes; the tuner's rate."""
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), context.Event()
    shares = [trials[i::posters] for i in range(posters)]
    procs = [
        context.Process(target=_post, args=(gateway, secret, experiment, share, per_trial, ready, go))
        for share in shares
        if share
    ]
    for proc in procs:
        proc.start()
    for _ in procs:  # every poster has built its bodies
        if not ready.acquire(timeout=300):
            raise RuntimeError("a poster process did not get ready in 300 s")
    total = len(trials) * per_trial

    async def run() -> MetricFigures:
        started = asyncio.Event()
        reader = asyncio.create_task(_count(nats_url, experiment, total, started))
        await started.wait()
        await asyncio.sleep(0.5)  # the subscription is in place
        begin = time.perf_counter()
        go.set()
        end = await asyncio.wait_for(reader, 600)
        return MetricFigures(total, end - begin)

    try:
        return asyncio.run(run())
    finally:
        for proc in procs:
            proc.join(30)
            if proc.exitcode != 0:
                raise RuntimeError(f"a poster process ended with exit code {proc.exitcode}")
