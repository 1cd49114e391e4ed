"""The dispatcher service: state load, bus consumers, the sweep, the NATS and REST APIs.

Start order: load state from KV → rebuild queues → consume EVENTS and METRICS (durable,
from the ack floor, so nothing published while the dispatcher was down, nor anything a
killed run held unapplied, is missed: :mod:`.consumer`) → sweep → APIs.
Stop order: REST and NATS APIs stop taking calls → consumers stop between batches
(unacked messages are redelivered to the next run) → the sweep stops.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts import streams, subjects
from contracts.base import ContractError
from contracts.messages import PlatformStatus, TrialEvent
from contracts.metrics import raw_records_of
from services.common.auth import bind_host
from services.common.bus import Bus
from services.common.http import HttpServer
from services.common.lifecycle import Service
from services.common.tasks import cancel_and_wait, first_failure
from services.dispatcher import bus_api
from services.dispatcher.api import create_app
from services.dispatcher.callout import Callout
from services.dispatcher.consumer import GroupCommit, StreamReader
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
        self._api: list[Subscription] = []
        self._callout: Callout | None = None
        self._heartbeats: Subscription | None = None
        self._tasks: list[asyncio.Task] = []
        self._readers: list[StreamReader] = []
        self._events_commit: GroupCommit | None = None
        self._metrics_commit: GroupCommit | None = None
        self._stopping = asyncio.Event()

    @property
    def _core(self) -> Dispatcher:
        """The dispatcher, for what runs once started (the consumers, the sweep, the APIs)."""
        if self.core is None:
            raise RuntimeError("the dispatcher service is not started")
        return self.core

    def _commit(self, commit: GroupCommit | None) -> GroupCommit:
        """A reader's group commit, made at start."""
        if commit is None:
            raise RuntimeError("the dispatcher service is not started")
        return commit

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        store = StateStore()
        await store.load(bus)
        self.core = Dispatcher(self.settings, bus, store)
        self.core.rebuild()
        await self.core.people.load()
        await self.core.teams.load()
        inbox = bus.nc.new_inbox().rpartition(".")[0]
        self._events_commit = GroupCommit(store.flush, self.settings.state_write_delay)
        self._metrics_commit = GroupCommit(store.flush, self.settings.state_write_delay)
        self._readers = [
            StreamReader(
                bus.js, "EVENTS", self._on_events, batch=64, inbox_prefix=inbox, settle=self._events_commit.settle
            ),
            StreamReader(
                bus.js,
                "METRICS",
                self._on_metrics,
                batch=1000,
                on_floor=self.core.metrics.applied,
                inbox_prefix=inbox,
                settle=self._metrics_commit.settle,
            ),
        ]
        self._tasks = [
            *(asyncio.create_task(reader.run(self._stopping)) for reader in self._readers),
            asyncio.create_task(self._sweep()),
            asyncio.create_task(self._offer_freed()),
            asyncio.create_task(self._preempt_on_arrival()),
            asyncio.create_task(self._watch_platforms(bus)),
        ]
        if self.settings.nats_callout_seed is not None:  # people connect to NATS with their token
            self._callout = Callout(bus.nc, self.settings.nats_callout_seed.get_secret_value(), self.core.people.person)
            await self._callout.start()
        self._api = await bus_api.serve(bus, self.core)
        self._heartbeats = await bus.nc.subscribe(subjects.heartbeats("*", "*"), cb=self._on_heartbeat)
        host = bind_host(self.settings, self.settings.api_host, "the REST API")
        app = create_app(self.settings, lambda: self._core, lambda: self.bus)
        self.http = HttpServer(app, host, self.settings.api_port)
        await self.http.start()
        roles = (
            "no token"
            if self.settings.api_token is None
            else ("full and read-only tokens" if self.settings.api_read_token else "token required")
        )
        log.info("REST API on http://%s:%d/api/v1 (%s)", host, self.http.port, roles)

    def failed(self) -> BaseException | None:
        return first_failure(self._tasks) or (self.http.failed() if self.http else None)

    async def stop(self) -> None:
        self._stopping.set()
        if self.http:
            await self.http.stop()
        for api in self._api:
            await api.unsubscribe()
        if self._callout:
            await self._callout.stop()
        if self._heartbeats:
            await self._heartbeats.unsubscribe()
        await cancel_and_wait(self._tasks)
        if self.core is not None:  # the last second's submits, in the audit trail
            await self.core.people.flush()
        for reader in self._readers:  # unsubscribed before the drain, so it does not wait on them
            await reader.close()

    async def _on_heartbeat(self, msg: Msg) -> None:
        trials = self._core.store.trials
        self._core.liveness.on_heartbeat(msg.subject, msg.data, lambda t: trials[t].attempt if t in trials else None)

    async def _on_events(self, msgs: list[Msg]) -> None:
        events = []  # each with its subject: it names the publisher (the trial's owner or not)
        for msg in msgs:
            if subjects.source_from_subject(msg.subject) == subjects.DISPATCHER:
                continue  # its own decisions, for the history: their state is the cache's already
            try:
                events.append((msg.subject, TrialEvent.decode(msg.data)))
            except ContractError as exc:
                log.error("dropping malformed event on %s: %s", msg.subject, exc)
        changed = await self._core.on_events(events)
        self._commit(self._events_commit).add(changed, msgs[-1])  # in KV, then acked (cumulative), a little later

    async def _on_metrics(self, msgs: list[Msg]) -> None:
        # The gateway validated every record; here only the fields that change trial state
        # are read (orjson, no models: the dispatcher reads every record). A message is one
        # record or a keeper's batch of them (contracts.metrics).
        records = []
        for msg in msgs:
            try:
                records.extend(raw_records_of(msg.data))
            except (ValueError, KeyError):
                log.error("dropping malformed metric on %s", msg.subject)
        try:
            folds = MetricFold.fold(records)
        except (KeyError, TypeError) as exc:
            log.error("dropping a batch of metrics with a malformed record: %s", exc)
            folds = []
        changed = await self._core.on_metrics(folds, msgs[-1].metadata.sequence.stream)
        self._commit(self._metrics_commit).add(changed, msgs[-1])  # in KV, then acked (cumulative), a little later

    async def _watch_platforms(self, bus: Bus) -> None:
        """Keep the adapters' statuses (the ``platforms`` bucket) for hybrid placement; a broken
        watch is opened again (the statuses are a few seconds old at worst)."""
        kv = await bus.kv(streams.bucket_name(streams.PLATFORMS_BUCKET))
        while not self._stopping.is_set():
            try:
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None:
                        continue
                    try:
                        status = PlatformStatus.decode(entry.value) if entry.value else None
                    except ContractError as exc:
                        log.warning("ignoring the platform status under %s: %s", entry.key, exc)
                        continue
                    self._core.slots.placement.status(entry.key, status)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watching the platforms' statuses failed (%s); watching again", exc)
                await asyncio.sleep(1.0)

    async def _offer_freed(self) -> None:
        """Capacity freed on a platform teams share goes to its waiting experiments at once."""
        slots = self._core.slots
        while not self._stopping.is_set():
            await slots.wake.wait()
            try:
                await self._core.sweeper.offer_freed()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("offering freed capacity failed; the sweep offers it within a second")

    async def _preempt_on_arrival(self) -> None:
        """An experiment began waiting on a platform teams share: what it may preempt, at once."""
        slots = self._core.slots
        while not self._stopping.is_set():
            await slots.arrival.wait()
            slots.arrival.clear()
            try:
                await self._core.sweeper.preempt()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("preempting for a newly waiting experiment failed; the sweep looks within a second")

    async def _sweep(self) -> None:
        while not self._stopping.is_set():
            await asyncio.sleep(1.0)
            try:
                await self._core.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep failed; retrying in a second")
