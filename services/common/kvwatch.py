"""Reading a KV bucket: its current values, then its changes, with a trustworthy "caught up".

nats-py's ``KeyValue.watchall`` (and ``keys``, built on it) signals the end of the current
values when the server reports nothing pending *and* the client has handled nothing yet.
The second count is the client's: when the first values are on their way but not handled
at that instant, the end is signalled before them, ``keys()`` answers an empty bucket and a
loader stops before reading anything. On a loaded machine that happens (a restarted
dispatcher would load no experiment; ``/platforms`` would lose an adapter for a moment).
Here the end is decided by the server alone: its consumer has delivered nothing and has
nothing pending (the bucket is empty), or a delivered value had nothing pending after it.

:func:`watch` yields every current value, then ``None`` once, then each change as it comes;
:func:`current` is the current values alone. Each costs one ordered consumer, so reading
``n`` keys is one subscription and ``n`` messages, never ``n`` requests; the consumer is
deleted when the reading ends (nats-py's own leave theirs for 5 minutes, and a stream
refuses new consumers past 1,000: a page polling every second would reach it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from services.common.bus import Bus

_REMOVED = {"DEL", "PURGE"}
#: Seconds the server keeps a consumer nobody listens to: one left behind by a closed
#: connection goes soon (a stream holds at most 1,000 of them here; nats-py's default is 5 min).
INACTIVE = 30.0


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: bytes
    revision: int
    #: A delete or purge marker (``value`` is empty): the key is gone.
    deleted: bool


async def watch(
    bus: Bus, bucket: str, keys: str = ">", *, deletes: bool = False, meta_only: bool = False
) -> AsyncGenerator[Entry | None, None]:
    """The bucket's current values under ``keys`` (a subject filter), then ``None`` once,
    then every change. Delete markers only when ``deletes``; ``meta_only`` leaves values empty.

    Close it (``contextlib.aclosing``) when done: that removes its consumer.
    """
    prefix = f"$KV.{bucket}."
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def enqueue(msg: Msg) -> None:
        queue.put_nowait(msg)

    sub = await bus.js.subscribe(
        prefix + keys,
        stream=f"KV_{bucket}",
        cb=enqueue,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        headers_only=meta_only,
        inactive_threshold=INACTIVE,
    )
    try:
        info = await sub.consumer_info()
        delivered = info.delivered  # the server always says; without it, nothing was delivered
        caught_up = info.num_pending == 0 and (delivered is None or delivered.consumer_seq == 0)  # empty
        if caught_up:
            yield None
        while True:
            msg = await queue.get()
            headers = msg.headers or {}
            deleted = headers.get("KV-Operation") in _REMOVED or "Nats-Marker-Reason" in headers
            if deletes or not deleted:
                yield Entry(
                    msg.subject[len(prefix) :], b"" if meta_only else msg.data, msg.metadata.sequence.stream, deleted
                )
            if not caught_up and msg.metadata.num_pending == 0:
                caught_up = True
                yield None
    finally:  # the server keeps an unsubscribed consumer until INACTIVE: remove it now
        with contextlib.suppress(Exception):  # the connection may be gone already
            await sub.unsubscribe()
            await bus.js.delete_consumer(f"KV_{bucket}", sub._consumer)


async def current(bus: Bus, bucket: str, keys: str = ">") -> list[Entry]:
    """The values under ``keys`` now (deleted keys left out), in the order the bucket holds them."""
    found: list[Entry] = []
    async with contextlib.aclosing(watch(bus, bucket, keys)) as entries:
        async for entry in entries:
            if entry is None:
                return found
            found.append(entry)
    return found
