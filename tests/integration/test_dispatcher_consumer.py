"""The dispatcher's cumulative-ack reading of a stream against a real nats-server: a message is
never acknowledged before it was applied, whatever a previous run or a failed batch left."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg

from contracts import streams, subjects
from services.common.bus import bootstrap
from services.dispatcher.consumer import GroupCommit, StreamReader, first_gap
from tests.fixtures.nats import NatsServer


@pytest.fixture
async def js(nats_server: NatsServer):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await bootstrap(js)
    yield js
    await nc.close()


class Applier:
    """A handler as the dispatcher's: apply (record the sequences), then ack the batch's last."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.applied: list[int] = []
        self.fail_on = fail_on

    async def __call__(self, msgs: list[Msg]) -> None:
        seqs = [m.metadata.sequence.stream for m in msgs]
        if self.fail_on in seqs:
            self.fail_on = None
            raise ConnectionError("KV write failed")
        self.applied += seqs
        await msgs[-1].ack()


async def publish(js, first: int, last: int) -> None:
    for i in range(first, last + 1):
        await js.publish(subjects.events("exp", f"t{i}", "local-gpu"), str(i).encode())


async def applied_through(applier: Applier, seq: int, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not applier.applied or max(applier.applied) < seq:
            await asyncio.sleep(0.02)


async def floor(js) -> tuple[int, int]:
    await asyncio.sleep(0.2)  # the ack reaches the server
    info = await js.consumer_info("EVENTS", streams.dispatcher_consumer("EVENTS").durable_name)
    return info.ack_floor.stream_seq, info.num_ack_pending


async def test_what_a_killed_run_held_unapplied_is_applied_before_anything_after_it_is_acked(js, nats_server):
    # Given a previous run that received messages 1..5 and died before applying (acking) them
    await publish(js, 1, 5)
    dead = await nats.connect(nats_server.url)
    held = []

    async def hold(msg: Msg) -> None:
        held.append(msg)

    sub = await dead.jetstream().subscribe(
        "events.>",
        durable="dispatcher-events",
        stream="EVENTS",
        config=streams.dispatcher_consumer("EVENTS"),
        manual_ack=True,
        cb=hold,
    )
    async with asyncio.timeout(5):
        while len(held) < 5:
            await asyncio.sleep(0.02)
    await sub.unsubscribe()
    await dead.close()

    # When the next run reads the stream while more arrives
    applier, stopping = Applier(), asyncio.Event()
    reader = StreamReader(js, "EVENTS", applier, batch=64)
    task = asyncio.create_task(reader.run(stopping))
    await publish(js, 6, 8)
    await applied_through(applier, 8)

    # Then 1..5 came again, first, and everything is applied once the floor passes it
    assert applier.applied == list(range(1, 9))
    assert await floor(js) == (8, 0)
    stopping.set()
    await reader.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_batch_that_fails_is_read_again_before_a_later_ack(js):
    applier, stopping = Applier(fail_on=3), asyncio.Event()
    reader = StreamReader(js, "EVENTS", applier, batch=2)
    task = asyncio.create_task(reader.run(stopping))
    await publish(js, 1, 6)
    await applied_through(applier, 6)
    assert sorted(set(applier.applied)) == list(range(1, 7)), "3 and 4 applied after their batch failed once"
    assert await floor(js) == (6, 0)
    stopping.set()
    await reader.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def delivered(stream_seq: int) -> Msg:
    """A JetStream delivery as the server addresses its ack subject."""
    return Msg(_client=None, subject="events.exp.t", reply=f"$JS.ACK.EVENTS.dispatcher-events.1.{stream_seq}.1.0.0")


def test_a_gap_in_the_stream_sequences_is_found_and_redeliveries_are_not_gaps():
    assert first_gap([delivered(s) for s in (7, 8, 9)], None) is None, "the first is taken as it comes"
    assert first_gap([delivered(s) for s in (5, 6, 8, 9)], 4) == 2
    assert first_gap([delivered(s) for s in (3, 6)], 6) is None, "redeliveries of applied ones"
    assert first_gap([delivered(7)], 5) == 0


async def test_a_consumer_made_for_another_inbox_is_made_again_from_its_ack_floor(js, nats_server):
    # Given a run before the broker had users: it applied 1..3 through a consumer delivering to _INBOX.
    applier, stopping = Applier(), asyncio.Event()
    reader = StreamReader(js, "EVENTS", applier, batch=64)
    task = asyncio.create_task(reader.run(stopping))
    await publish(js, 1, 3)
    await applied_through(applier, 3)
    assert await floor(js) == (3, 0)
    stopping.set()
    await reader.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    # When the dispatcher runs as its own user, which may receive only on _INBOX_dispatcher.>
    nc = await nats.connect(nats_server.url, inbox_prefix="_INBOX_dispatcher")
    applier, stopping = Applier(), asyncio.Event()
    reader = StreamReader(nc.jetstream(), "EVENTS", applier, batch=64, inbox_prefix="_INBOX_dispatcher")
    task = asyncio.create_task(reader.run(stopping))
    await publish(js, 4, 5)
    await applied_through(applier, 5)

    # Then it reads on from the floor, through a consumer that delivers to its own inbox
    assert applier.applied == [4, 5]
    info = await js.consumer_info("EVENTS", streams.dispatcher_consumer("EVENTS").durable_name)
    assert info.config.deliver_subject.startswith("_INBOX_dispatcher.")
    stopping.set()
    await reader.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await nc.close()


class Committed:
    """A handler as the dispatcher's METRICS: apply now, leave the write and the ack to a GroupCommit."""

    def __init__(self, delay: float, fail_writes: int = 0) -> None:
        self.applied: list[int] = []
        self.writes: list[set[str]] = []
        self.fail_writes = fail_writes
        self.commit = GroupCommit(self.write, delay)

    async def write(self, keys: set[str]) -> None:
        if self.fail_writes:
            self.fail_writes -= 1
            raise ConnectionError("KV write failed")
        self.writes.append(keys)

    async def __call__(self, msgs: list[Msg]) -> None:
        seqs = [m.metadata.sequence.stream for m in msgs]
        self.applied += seqs
        self.commit.add({f"t{s}" for s in seqs}, msgs[-1])


async def stop(reader: StreamReader, task: asyncio.Task, stopping: asyncio.Event) -> None:
    stopping.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await reader.close()


async def test_a_group_commit_writes_batches_after_their_delay_and_acks_them_after_the_write(js):
    handler, stopping = Committed(delay=1.0), asyncio.Event()
    reader = StreamReader(js, "EVENTS", handler, batch=2, settle=handler.commit.settle)
    task = asyncio.create_task(reader.run(stopping))
    await publish(js, 1, 6)
    await applied_through(handler, 6)  # three batches, applied at once
    assert handler.writes == [] and await floor(js) == (0, 6), "neither written nor acked before the delay"
    async with asyncio.timeout(5):
        while not handler.writes:
            await asyncio.sleep(0.02)
    async with asyncio.timeout(5):
        while set().union(*handler.writes) != {f"t{i}" for i in range(1, 7)}:
            await asyncio.sleep(0.02)
    assert await floor(js) == (6, 0)
    await stop(reader, task, stopping)


async def test_a_group_write_that_fails_acks_nothing_and_its_batches_are_read_again(js):
    handler, stopping = Committed(delay=0.1, fail_writes=1), asyncio.Event()
    reader = StreamReader(js, "EVENTS", handler, batch=2, settle=handler.commit.settle)
    task = asyncio.create_task(reader.run(stopping))
    await publish(js, 1, 4)
    await applied_through(handler, 4)
    await asyncio.sleep(0.3)  # the write failed
    assert handler.writes == [] and (await floor(js))[0] == 0
    await publish(js, 5, 5)  # the next batch says so: the reader reads again from the ack floor
    async with asyncio.timeout(10):
        while not handler.writes or (await floor(js))[0] < 5:
            await asyncio.sleep(0.05)
    assert handler.applied[:4] == [1, 2, 3, 4] and sorted(set(handler.applied)) == [1, 2, 3, 4, 5]
    assert handler.applied.count(1) == 2, "read again after the failed write"
    assert set().union(*handler.writes) == {f"t{i}" for i in range(1, 6)}
    await stop(reader, task, stopping)


async def test_a_stop_writes_and_acks_what_waits_for_its_group_commit(js):
    handler, stopping = Committed(delay=30.0), asyncio.Event()
    reader = StreamReader(js, "EVENTS", handler, batch=64, settle=handler.commit.settle)
    task = asyncio.create_task(reader.run(stopping))
    await publish(js, 1, 3)
    await applied_through(handler, 3)
    await stop(reader, task, stopping)  # long before the delay is over
    assert handler.writes == [{"t1", "t2", "t3"}]
    assert await floor(js) == (3, 0)
