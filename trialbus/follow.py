"""Reading a stream from its start, live after: what ``AsyncClient.events()`` and ``metrics()`` yield.

Guarantees: oldest first, through an ordered consumer; each record once, even when it was stored
twice; a bounded buffer (a slow reader holds the server back, memory does not fill up); and the
iterator ends when its client closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

import nats
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from contracts.base import Contract, ContractError
from trialbus.api import TrialbusError

log = logging.getLogger(__name__)

C = TypeVar("C", bound=Contract)


async def follow(
    js: JetStreamContext, stream: str, filters: list[str], limit: int, followers: set[Callable[[], None]]
) -> AsyncIterator[bytes]:
    """Payloads of an ordered consumer on the subjects ``filters`` match, oldest first.

    A callback subscription fills a local buffer that this generator drains: nats-py's
    ``sub.messages`` spends a task and two loop turns per message, which halved the rate
    a tuner could read metrics at. When the buffer holds ``limit`` messages the
    callback waits for the reader, so flow control holds the server back from a slow
    tuner instead of memory filling up. While it runs, ``followers`` holds the callable
    that ends it (the client calls it when it closes).
    """
    buffer: deque[bytes] = deque()
    ready, room, ended = asyncio.Event(), asyncio.Event(), asyncio.Event()
    room.set()

    async def on_message(msg: Msg) -> None:
        buffer.append(msg.data)
        ready.set()
        if len(buffer) >= limit and not ended.is_set():
            room.clear()
            await room.wait()

    def end() -> None:  # the client closes: the iterator ends after what it holds
        ended.set()
        room.set()
        ready.set()

    try:
        several = ConsumerConfig(filter_subjects=filters) if len(filters) > 1 else None
        sub = await js.subscribe(
            filters[0],
            stream=stream,
            cb=on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            config=several,
        )
    except NotFoundError:
        raise TrialbusError(503, f"stream {stream} does not exist yet; is the stack running?") from None
    followers.add(end)
    try:
        while True:
            while buffer:
                yield buffer.popleft()
                if len(buffer) <= limit // 2:
                    room.set()
            if ended.is_set():
                return
            room.set()
            ready.clear()
            await ready.wait()
    finally:
        followers.discard(end)
        # The connection may be draining or closed already (the client is closing).
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def unique(
    payloads: AsyncIterator[bytes], what: str, decode: Callable[[bytes], list[C]], first_time: Callable[[C], bool]
) -> AsyncGenerator[C, None]:
    """Decoded items, each once (``decode`` gives a message's items: a metric message holds one
    record or a keeper's batch; ``first_time`` says whether an item is new), in case an item was
    stored twice (a resend after the stream's dedupe window, or in another batch)."""
    async for data in payloads:
        try:
            items = decode(data)
        except ContractError as exc:
            log.warning("skipping a message on %s: %s", what, exc)
            continue
        for item in items:
            if first_time(item):
                yield item
