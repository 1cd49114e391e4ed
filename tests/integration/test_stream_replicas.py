"""On a NATS cluster of 3 (as k8s/ runs it), ``TRIALBUS_STREAM_REPLICAS=3`` makes every stream,
bucket and the code store keep three copies, so one server's restart pauses nothing."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import nats
import pytest
from nats.js.errors import ServiceUnavailableError

from contracts import streams
from services.common.bus import bootstrap
from tests.fixtures.nats import free_port, nats_server_binary, require_binary

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cluster(tmp_path: Path):
    binary = require_binary(nats_server_binary(), "nats-server")
    ports, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    seeds = ",".join(f"nats://127.0.0.1:{p}" for p in routes)
    procs = [
        subprocess.Popen(
            [
                binary,
                "-js",
                "-sd",
                str(tmp_path / f"n{i}"),
                "-a",
                "127.0.0.1",
                "-p",
                str(ports[i]),
                "--server_name",
                f"n{i}",
                "--cluster_name",
                "tb",
                "--cluster",
                f"nats://127.0.0.1:{routes[i]}",
                "--routes",
                seeds,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(3)
    ]
    yield [f"nats://127.0.0.1:{p}" for p in ports]
    for proc in procs:
        proc.terminate()
        proc.wait(10)


async def test_every_stream_bucket_and_store_keeps_three_copies(cluster):
    nc = await nats.connect(cluster)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + 30
        while True:  # the cluster elects its JetStream meta leader first
            try:
                await bootstrap(js, replicas=3)
                break
            except (ServiceUnavailableError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        names = [c.name for c in streams.STREAMS] + [f"KV_{c.bucket}" for c in streams.BUCKETS]
        names.append(f"OBJ_{streams.CODE_STORE.bucket}")
        for name in names:
            assert (await js.stream_info(name)).config.num_replicas == 3, name
        await bootstrap(js, replicas=3)  # idempotent
    finally:
        await nc.close()
