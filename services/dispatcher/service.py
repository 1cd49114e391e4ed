"""The dispatcher service: state load, bus consumers, the sweep, the NATS and REST APIs.

Start order: load state from KV → rebuild queues → consume EVENTS and METRICS (durable,
so nothing published while the dispatcher was down is missed) → sweep → APIs.
Stop order: REST and NATS APIs stop taking calls → consumers stop between batches
(unacked messages are redelivered to the next run) → the sweep stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts import streams
from contracts.base import ContractError
from contracts.messages import TrialEvent
from services.common.bus import Bus
from services.common.http import HttpServer
from services.common.lifecycle import Service
from services.dispatcher import bus_api
from services.dispatcher.api import create_app
from services.dispatcher.core import Dispatcher
from services.dispatcher.folds import MetricFold
from services.dispatcher.settings import DispatcherSettings
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)


class DispatcherService(Service):
    name = "dispatcher"

    def __init__(self, settings: DispatcherSettings) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.core: Dispatcher | None = None
        self.http: HttpServer | None = None
        self._api: Subscription | None = None
        self._tasks: list[asyncio.Task] = []
        self._subs: list[Subscription] = []
        self._stopping = asyncio.Event()

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        store = StateStore()
        await store.load(bus)
        self.core = Dispatcher(self.settings, bus, store)
        self.core.rebuild()
        self._tasks = [
            asyncio.create_task(self._consume("EVENTS", self._on_events, batch=64)),
            asyncio.create_task(self._consume("METRICS", self._on_metrics, batch=1000)),
            asyncio.create_task(self._sweep()),
        ]
        self._api = await bus_api.serve(bus, self.core)
        self.http = HttpServer(
            create_app(self.settings, lambda: self.core, lambda: self.bus),
            self.settings.api_host,
            self.settings.api_port,
        )
        await self.http.start()
        log.info("REST API on http://%s:%d/api/v1", self.settings.api_host, self.http.port)

    def failed(self) -> BaseException | None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception():
                return task.exception()
        return self.http.failed() if self.http else None

    async def stop(self) -> None:
        self._stopping.set()
        if self.http:
            await self.http.stop()
        if self._api:
            await self._api.unsubscribe()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in self._subs:  # unsubscribed before the drain, so it does not wait on them
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_events(self, msgs: list[Msg]) -> None:
        events = []
        for msg in msgs:
            try:
                events.append(TrialEvent.decode(msg.data))
            except ContractError as exc:
                log.error("dropping malformed event on %s: %s", msg.subject, exc)
        await self.core.on_events(events)
        await msgs[-1].ack()  # cumulative: the whole batch is applied and in KV

    async def _on_metrics(self, msgs: list[Msg]) -> None:
        # The gateway validated every record against MetricRecord; here only the fields
        # that change trial state are read (orjson: the dispatcher reads every record).
        records = []
        for msg in msgs:
            try:
                record = orjson.loads(msg.data)
                if record.get("kind") == "trial.metric" and isinstance(record.get("sequence"), int):
                    records.append(record)
                    continue
            except orjson.JSONDecodeError:
                pass
            log.error("dropping malformed metric on %s", msg.subject)
        try:
            folds = MetricFold.fold(records)
        except (KeyError, TypeError) as exc:
            log.error("dropping a batch of metrics with a malformed record: %s", exc)
            folds = []
        await self.core.on_metrics(folds, msgs[-1].metadata.sequence.stream)
        await msgs[-1].ack()  # cumulative, once the state they produced is in KV

    async def _consume(self, stream: str, handle: Callable[[list[Msg]], Awaitable[None]], batch: int) -> None:
        """Apply the stream in batches, from the durable consumer's ack floor on.

        A push consumer: the server sends as fast as the dispatcher acks (flow control), and
        messages are collected by a callback. nats-py's pull ``fetch`` awaits every message
        on its own, which cost the dispatcher ~60 µs per metric record.
        """
        config = streams.dispatcher_consumer(stream)
        inbox: list[Msg] = []
        ready = asyncio.Event()

        async def collect(msg: Msg) -> None:
            inbox.append(msg)
            ready.set()

        while True:
            try:
                sub = await self.bus.js.subscribe(
                    f"{stream.lower()}.>",
                    durable=config.durable_name,
                    stream=stream,
                    config=config,
                    manual_ack=True,
                    cb=collect,
                    flow_control=True,
                    idle_heartbeat=5.0,
                )
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker not ready yet: retry, never lose the loop
                if "deliver_subject is required" in str(exc):
                    # A store from a release whose dispatcher pulled: replace that consumer.
                    # The stream is replayed from its start, which changes nothing (idempotent).
                    log.warning("replacing the pull consumer %s on %s", config.durable_name, stream)
                    await self.bus.js.delete_consumer(stream, config.durable_name)
                    continue
                log.warning("subscribing to %s failed (%s); retrying", stream, exc)
                await asyncio.sleep(0.5)
        self._subs.append(sub)
        if stream == "METRICS":
            self.core.metrics.applied((await sub.consumer_info()).ack_floor.stream_seq)
        while not self._stopping.is_set():
            await ready.wait()
            ready.clear()
            while inbox:
                msgs, inbox[:] = inbox[:batch], inbox[batch:]
                try:
                    await handle(msgs)
                except asyncio.CancelledError:
                    raise
                except Exception:  # not acked: the server redelivers them after ack_wait
                    log.exception("handling %d %s messages failed; they will be redelivered", len(msgs), stream)

    async def _sweep(self) -> None:
        while not self._stopping.is_set():
            await asyncio.sleep(1.0)
            try:
                await self.core.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep failed; retrying in a second")
