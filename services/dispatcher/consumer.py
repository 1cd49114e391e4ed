"""The dispatcher's reading of EVENTS and METRICS: in batches, cumulative acks, never past a gap.

The dispatcher applies a stream in batches and acks each batch once, cumulatively
(``AckPolicy.ALL``: an ack of message N acknowledges every delivery before it). That is only
safe while every message before N was applied. Three things can break it:

- a previous run (SIGKILLed, OOM-killed) died holding deliveries it had not applied: the
  server counts them delivered, and the first ack of this run would acknowledge them unread;
- a batch fails to apply (the broker went away mid-write): the next batch's ack would
  acknowledge the failed one;
- the broker dies having counted messages delivered that never reached us.

So: a consumer with deliveries beyond its ack floor is made again from the ack floor before
we subscribe (the messages come again, in order, before any later one), and a failed batch or
a gap in the stream sequences ends the subscription, and we subscribe again the same way.
Handlers are idempotent, so reading a message twice changes nothing.

A push consumer: the server sends as fast as the dispatcher acks (flow control), and
messages are collected by a callback. nats-py's pull ``fetch`` awaits every message on its
own, which cost the dispatcher ~60 µs per metric record.

A reader may write and ack its batches a little after it applied them (:class:`GroupCommit`,
METRICS): a trial's final metric is then mostly written with its end, one KV write instead of two.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from contracts import streams

log = logging.getLogger(__name__)


class _Busy(RuntimeError):
    """The durable consumer still has a subscriber (a previous run the server has not seen go)."""


def first_gap(msgs: list[Msg], last: int | None) -> int | None:
    """The index of the first message whose stream sequence skips past ``last + 1`` (messages
    delivered that never arrived), or None. Redeliveries (sequences at or below ``last``) are
    no gap. ``last`` None: the first message is taken as it comes (the server starts at the
    first message after the ack floor that still exists)."""
    for index, msg in enumerate(msgs):
        seq = msg.metadata.sequence.stream
        if last is not None and seq > last + 1:
            return index
        last = seq if last is None else max(last, seq)
    return None


class GroupCommit:
    """Writes and acks batches a while after they were applied to the cache, several at a time.

    ``add`` takes an applied batch: the keys it left to write (``write`` writes them) and its
    last message. Each batch waits ``delay`` seconds (a key changed again meanwhile, or written
    by someone else, is written once); then the batches due are written together and the last
    of them acked. One commit runs at a time and batches are due in the order they came, so
    acks go out in stream order and an ack never passes a batch not yet written. A failed
    write acks nothing (nor any batch after it): the next ``add`` raises it, and the reader
    reads again from the ack floor (the states stay dirty in the cache until written).
    ``settle`` commits every batch at once and returns when nothing is in flight: before the
    reader subscribes again (no ack of the old subscription may reach the consumer made
    again) and at stop. Per batch O(its keys).
    """

    def __init__(self, write: Callable[[set[str]], Awaitable[None]], delay: float) -> None:
        self.write, self.delay = write, delay
        self._waiting: collections.deque[tuple[float, Iterable[str], Msg]] = collections.deque()
        self._task: asyncio.Task | None = None
        self._now = asyncio.Event()
        self._failure: Exception | None = None

    def add(self, keys: Iterable[str], last: Msg) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        self._waiting.append((time.monotonic() + self.delay, keys, last))
        if self._task is None:
            self._task = asyncio.create_task(self._commit())

    async def settle(self) -> None:
        if self._task is not None:
            self._now.set()
            await asyncio.shield(self._task)  # a stop that cancels the reader lets the commit finish
        self._now.clear()

    async def _commit(self) -> None:
        waiting = self._waiting
        try:
            while waiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._now.wait(), waiting[0][0] - time.monotonic())
                now, due = time.monotonic(), []
                while waiting and (waiting[0][0] <= now or self._now.is_set()):
                    due.append(waiting.popleft())
                if due:  # (a timer may fire a hair early)
                    await self.write(set().union(*(keys for _, keys, _ in due)))
                    await due[-1][2].ack()  # cumulative: this batch and every one before it
        except Exception as exc:  # noqa: BLE001 - said by the reader, at its next batch
            self._failure = exc
            waiting.clear()
        finally:
            self._task = None


class StreamReader:
    """Applies ``stream`` through ``handle`` (which acks each batch it applied, or leaves it to a
    :class:`GroupCommit` whose ``settle`` is given) until ``stopping``."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        handle: Callable[[list[Msg]], Awaitable[None]],
        batch: int,
        on_floor: Callable[[int], None] = lambda seq: None,
        inbox_prefix: str = "_INBOX",
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.js = js
        #: Waits for the acks ``handle`` left for later (:meth:`GroupCommit.settle`).
        self.settle = settle
        #: Where this connection may receive (``_INBOX_<user>`` under users): a consumer that
        #: delivers elsewhere (made by a run with another user, or none) is made again.
        self.inbox_prefix = inbox_prefix
        self.stream = stream
        self.handle = handle
        self.batch = batch
        #: Told the ack floor at every subscription: everything up to it is applied.
        self.on_floor = on_floor
        self._sub: JetStreamContext.PushSubscription | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            inbox: list[Msg] = []
            ready = asyncio.Event()

            async def collect(msg: Msg, inbox: list[Msg] = inbox, ready: asyncio.Event = ready) -> None:
                inbox.append(msg)
                ready.set()

            floor = await self._subscribe(collect)
            self.on_floor(floor)
            try:
                await self._apply(inbox, ready, stopping)
            finally:
                try:
                    if self.settle is not None:
                        await self.settle()  # acked (or not) before the consumer is looked at again
                finally:
                    await self.close()

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _apply(self, inbox: list[Msg], ready: asyncio.Event, stopping: asyncio.Event) -> None:
        """Apply batches until stopping; return early (to read again from the ack floor) after a
        failed batch or a gap."""
        last: int | None = None
        while not stopping.is_set():
            await ready.wait()
            ready.clear()
            while inbox:
                msgs = inbox[: self.batch]
                gap = first_gap(msgs, last)
                msgs = msgs if gap is None else msgs[:gap]
                del inbox[: len(msgs)]
                if msgs:
                    try:
                        await self.handle(msgs)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception(
                            "applying %d %s messages failed; reading again from the last one applied",
                            len(msgs),
                            self.stream,
                        )
                        await asyncio.sleep(0.5)
                        return
                    applied = max(m.metadata.sequence.stream for m in msgs)
                    last = applied if last is None else max(last, applied)
                if gap is not None:
                    log.warning(
                        "%s: messages after %s were counted delivered but never arrived; reading again "
                        "from the last one applied",
                        self.stream,
                        last,
                    )
                    return

    async def _subscribe(self, collect: Callable[[Msg], Awaitable[None]]) -> int:
        """Subscribe from the ack floor (retrying until the broker lets us); the ack floor."""
        said = False
        while True:
            try:
                config = await self._from_ack_floor()
                self._sub = sub = await self.js.subscribe(
                    f"{self.stream.lower()}.>",
                    durable=config.durable_name,
                    stream=self.stream,
                    config=config,
                    manual_ack=True,
                    cb=collect,
                    flow_control=True,
                    idle_heartbeat=5.0,
                )
                floor = (await sub.consumer_info()).ack_floor
                if floor is None:  # optional in nats.py's types; the server always reports it
                    raise ValueError(f"no ack floor in the consumer info of {self.stream}")
                return floor.stream_seq
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker not ready, or the previous subscriber not gone yet
                if not said:
                    log.warning("subscribing to %s failed (%s); retrying", self.stream, exc)
                    said = True
                await self.close()
                await asyncio.sleep(0.5)

    async def _from_ack_floor(self) -> ConsumerConfig:
        """The consumer config to subscribe with; a durable consumer that counts deliveries
        past its ack floor is deleted first, and made again starting after the floor."""
        config = streams.dispatcher_consumer(self.stream)
        durable = config.durable_name
        if durable is None:  # optional in nats.py's types; dispatcher_consumer always names it
            raise ValueError(f"consumer definition without a name: {config}")
        try:
            info = await self.js.consumer_info(self.stream, durable)
        except NotFoundError:
            return config
        if info.push_bound:
            raise _Busy(f"the consumer {config.durable_name} still has a subscriber")
        if not info.config.deliver_subject:
            # A store from a release whose dispatcher pulled: replace that consumer. The stream
            # is replayed from its start, which changes nothing (idempotent).
            log.warning("replacing the pull consumer %s on %s", config.durable_name, self.stream)
            await self.js.delete_consumer(self.stream, durable)
            return config
        floor = info.ack_floor.stream_seq
        ours = info.config.deliver_subject.startswith(self.inbox_prefix + ".")
        if info.delivered.stream_seq <= floor and ours:
            return config
        if not ours:  # e.g. made before the broker had users: we could not subscribe to it
            log.info(
                "%s: making the consumer %s again, to deliver to this user's inbox (from message %d)",
                self.stream,
                config.durable_name,
                floor + 1,
            )
        else:
            log.info(
                "%s: messages %d to %d were delivered but never acked (a previous run died holding them); "
                "reading them again",
                self.stream,
                floor + 1,
                info.delivered.stream_seq,
            )
        await self.js.delete_consumer(self.stream, durable)
        if floor == 0:
            return config
        return dataclasses.replace(config, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=floor + 1)
