"""Reading the KV buckets (``services.common.kvwatch``) against a real nats-server: every
current value and then the changes, an empty bucket answered at once, no consumer left
behind, and the adapters' statuses read per adapter."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import nats
import pytest

from contracts import PlatformStatus, streams
from contracts.base import utcnow
from services.common import kvwatch, platforms
from services.common.bus import Bus, bootstrap
from tests.fixtures.nats import NatsServer


@pytest.fixture
async def bus(nats_server: NatsServer):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await bootstrap(js)
    yield Bus(nc, js)
    await nc.drain()


async def consumers(bus: Bus, bucket: str) -> int:
    return (await bus.js.stream_info(f"KV_{bucket}")).state.consumer_count


async def test_an_empty_bucket_reads_as_empty_at_once(bus: Bus) -> None:
    async with asyncio.timeout(5):
        assert await kvwatch.current(bus, streams.TRIALS_BUCKET.bucket) == []


async def test_the_current_values_are_all_read_deleted_keys_left_out(bus: Bus) -> None:
    kv = await bus.kv(streams.TRIALS_BUCKET.bucket)
    for i in range(50):
        await kv.put(f"T{i:03}", b"v%d" % i)
    await kv.put("T007", b"newer")
    await kv.delete("T010")

    found = await kvwatch.current(bus, streams.TRIALS_BUCKET.bucket)

    values = {e.key: e.value for e in found}
    assert len(found) == len(values) == 49 and "T010" not in values
    assert values["T007"] == b"newer" and values["T049"] == b"v49"
    assert await consumers(bus, streams.TRIALS_BUCKET.bucket) == 0  # nothing left on the server


async def test_many_readers_at_once_each_see_every_key_and_leave_no_consumer(bus: Bus) -> None:
    """Under load nats-py's ``keys()`` could answer an empty bucket, and left a consumer per
    call for five minutes (a stream takes 1,000): readers at once, repeatedly, all see it."""
    kv = await bus.kv(streams.PLATFORMS_BUCKET.bucket)
    await kv.put("remote.r1", b"x")

    for _ in range(40):
        seen = await asyncio.gather(*(kvwatch.current(bus, streams.PLATFORMS_BUCKET.bucket) for _ in range(30)))
        assert all([e.key for e in found] == ["remote.r1"] for found in seen)

    assert await consumers(bus, streams.PLATFORMS_BUCKET.bucket) == 0


async def test_a_watch_gives_the_current_values_then_once_caught_up_each_change(bus: Bus) -> None:
    kv = await bus.kv(streams.EXPERIMENTS_BUCKET.bucket)
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    seen: list[kvwatch.Entry | None] = []
    async with contextlib.aclosing(kvwatch.watch(bus, streams.EXPERIMENTS_BUCKET.bucket, deletes=True)) as entries:
        async with asyncio.timeout(5):
            async for entry in entries:
                seen.append(entry)
                if entry is None:
                    await kv.put("c", b"3")
                    await kv.delete("a")
                elif entry.key == "a" and entry.deleted:
                    break

    assert [(e.key, e.value, e.deleted) if e else None for e in seen] == [
        ("a", b"1", False),
        ("b", b"2", False),
        None,
        ("c", b"3", False),
        ("a", b"", True),
    ]


async def test_statuses_are_read_per_adapter_and_stale_ones_left_out(bus: Bus) -> None:
    kv = await bus.kv(streams.PLATFORMS_BUCKET.bucket)
    stale = utcnow() - timedelta(seconds=streams.PLATFORMS_BUCKET.ttl + 5)
    for adapter, replica, time in (("remote", "r1", utcnow()), ("remote", "r2", stale), ("local", "l1", utcnow())):
        status = PlatformStatus(adapter=adapter, replica=replica, host="h", time=time, running=0)
        await kv.put(f"{adapter}.{replica}", status.encode())

    assert [s.replica for s in await platforms.statuses(bus, "remote")] == ["r1"]
    assert [s.replica for s in await platforms.statuses(bus, "local")] == ["l1"]
    assert [s.replica for s in await platforms.statuses(bus)] == ["l1", "r1"]
