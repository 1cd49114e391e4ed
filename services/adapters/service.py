"""The consume loop every platform adapter runs under: all adapter policy, written once.

:class:`AdapterService` turns a :class:`~services.adapters.base.PlatformAdapter` into a
Trialbus service. Guarantees, for every platform:

- **One work queue, many replicas.** All replicas share the durable pull consumer
  ``adapter-<name>`` on ``dispatch.<name>``; each request goes to one replica at a time.
- **Ack only once owned.** A request is acked after ``launch`` returned a handle (the
  platform owns the trial and this replica tracks it), and is heartbeated
  (``in_progress``) while a launch takes long. No capacity or a TransientError naks it
  with a delay; a PermanentError publishes FAILED, then acks; a malformed one is terminated.
- **Events are never lost.** RUNNING and terminal events go to ``events.<exp>.<trial>``
  with the dedupe id ``<trial>:<status>:<attempt>``, each published with JetStream's ack
  and retried until the broker takes it. A trial is released only after its terminal
  event is stored; otherwise the next start adopts it and publishes again.
- **The owner answers.** Every replica listens on ``control.<name>.cancel`` and
  ``control.<name>.log``; only the replica that owns the trial replies. A cancel that
  arrives while the trial is still launching takes effect once it is launched.
- **Trials outlive the service.** Stop (SIGTERM) stops intake, naks what was pulled but
  not launched, unsubscribes and returns, leaving trials running for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from pydantic import Field
from prometheus_client import CollectorRegistry, Counter, Histogram

from contracts import CancelReply, CancelRequest, ContractError, LogReply, LogRequest, TrialEvent, TrialRequest
from contracts import TrialStatus, streams, subjects
from contracts.base import utcnow
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.common import logs
from services.common.bus import Bus
from services.common.lifecycle import Service
from services.common.settings import ServiceSettings

log = logging.getLogger(__name__)

#: Seconds one fetch waits for work. Stop waits for the fetch in flight rather than
#: cancelling it, so a message the server hands out at that moment is nak'ed, not stranded.
FETCH_WAIT = 0.5


class AdapterSettings(ServiceSettings):
    """Settings of every adapter service (environment ``TRIALBUS_<NAME>``)."""

    #: This replica's id, unique among the adapter's replicas (default: the host name).
    replica: str = Field(default_factory=socket.gethostname, min_length=1)
    #: Seconds between two polls of every running trial (adapters also wake it on a trial's end).
    poll_interval: float = Field(default=0.5, gt=0)
    #: Launches in flight at once; also the most dispatch messages pulled at a time.
    launch_concurrency: int = Field(default=16, gt=0)
    #: Seconds before a request the platform had no capacity for is offered again.
    capacity_backoff: float = Field(default=1.0, gt=0)
    #: Seconds of the longest back-off after an unexpected launch error or a failed publish.
    max_backoff: float = Field(default=30.0, gt=0)
    #: Port of ``/healthz`` and ``/metrics`` (Prometheus); none served when unset.
    http_port: int | None = Field(default=None, ge=0, le=65535)
    #: Address the health and metrics endpoints bind to.
    http_host: str = "127.0.0.1"


class AdapterMetrics:
    """Prometheus metrics of one adapter service, on the registry it is given."""

    def __init__(self, registry: CollectorRegistry, platform: str) -> None:
        self.launched = Counter(
            "trialbus_adapter_trials_launched", "Trial attempts launched", ["platform"], registry=registry
        ).labels(platform)
        self.ended = Counter(
            "trialbus_adapter_trials_ended", "Trial attempts ended, by status", ["platform", "status"],
            registry=registry,
        )
        self.launch_seconds = Histogram(
            "trialbus_adapter_launch_seconds", "Seconds from pulling a request to the trial launched",
            ["platform"], registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        ).labels(platform)


@dataclass(eq=False)
class Owned:
    """A trial attempt this replica owns: launching, running, or ended and not yet reported."""

    experiment_id: str
    trial_id: str
    attempt: int
    handle: TrialHandle | None = None  # None while launching
    announced: bool = False  # RUNNING published: only then is it polled
    cancel: CancelRequest | None = None  # accepted cancel: the status it ends with
    cancel_sent: bool = False  # adapter.cancel succeeded
    outcome: TrialOutcome | None = None  # ended: the terminal event is being published
    retry_at: float = 0.0  # monotonic time before which it is not polled (after a poll error)


class AdapterService(Service):
    """Runs one :class:`PlatformAdapter` on the bus (see the module docstring)."""

    def __init__(
        self, adapter: PlatformAdapter, settings: AdapterSettings, registry: CollectorRegistry | None = None
    ) -> None:
        self.adapter = adapter
        self.settings = settings
        self.name = f"adapter-{adapter.name}"
        self.metrics = AdapterMetrics(registry or CollectorRegistry(), adapter.name)
        self.consumer = streams.adapter_consumer(adapter.name)
        self.owned: dict[str, Owned] = {}  # by dispatch id ``<trial>:<attempt>``
        self._recent: OrderedDict[str, TrialHandle] = OrderedDict()  # released, for log requests
        self._bus: Bus | None = None
        self._pull = None
        self._subs: list = []
        self._taking: dict[asyncio.Task, Msg] = {}
        self._finishing: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self._launch_done = asyncio.Event()  # a launch slot is free
        self._trial_ended = asyncio.Event()  # platform capacity may be free
        self._wake = asyncio.Event()
        self._due: set[TrialHandle] = set()
        self._poll_all = True
        self._paused_until = 0.0
        self._stopping = False
        self._http = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await self.adapter.start(bus)
        self.adapter.listen(self._on_notify)
        for handle in await self.adapter.adopt():
            owned = self._own(handle.experiment_id, handle.trial_id, handle.attempt)
            owned.handle = handle
            self._spawn(self._announce(owned), self._finishing)
        if handle_count := len(self.owned):
            log.info("adopted %d trial(s) from a previous run", handle_count)
        await bus.js.add_consumer(streams.DISPATCH.name, self.consumer)
        self._pull = await bus.js.pull_subscribe_bind(self.consumer.durable_name, stream=streams.DISPATCH.name)
        self._subs = [
            await bus.nc.subscribe(subjects.control(self.adapter.name, "cancel"), cb=self._on_cancel),
            await bus.nc.subscribe(subjects.control(self.adapter.name, "log"), cb=self._on_log),
        ]
        if self.settings.http_port is not None:
            from fastapi import FastAPI

            from services.common.http import HttpServer, health_routes

            app = FastAPI()
            app.include_router(health_routes(lambda: self._bus, lambda: {"trials": len(self.owned)}))
            self._http = HttpServer(app, self.settings.http_host, self.settings.http_port)
            await self._http.start()
        self._loops = [asyncio.create_task(loop()) for loop in (self._fetch_loop, self._poll_loop, self._heartbeat_loop)]

    async def stop(self) -> None:
        """Stop intake, nak unlaunched work, leave trials running; bounded by ``stop_timeout``."""
        self._stopping = True
        grace = min(5.0, self.settings.stop_timeout / 3)
        if self._loops:  # let the fetch in flight return (and nak) its messages, then stop every loop
            await asyncio.wait(self._loops[:1], timeout=FETCH_WAIT + 0.5)
        for task in self._loops:
            task.cancel()
        for group in (self._taking, self._finishing):  # launches first: then nothing new is owned
            if group:
                _, late = await asyncio.wait(list(group), timeout=grace)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(*self._loops, return_exceptions=True)
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if self._pull is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._pull.unsubscribe()
        self.adapter.listen(None)
        await self.adapter.stop()
        if self._http is not None:
            await self._http.stop()

    def failed(self) -> BaseException | None:
        for task in self._loops:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return self._http.failed() if self._http is not None else None

    # ---------------------------------------------------------------- intake

    async def _fetch_loop(self) -> None:
        failures = 0
        while not self._stopping:
            if (pause := self._paused_until - time.monotonic()) > 0:  # the platform was full
                self._trial_ended.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self._trial_ended.wait()
                self._paused_until = 0.0
                continue
            free = self.settings.launch_concurrency - len(self._taking)
            if free <= 0:
                self._launch_done.clear()
                await self._launch_done.wait()
                continue
            try:
                messages = await self._pull.fetch(free, timeout=FETCH_WAIT)
            except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either when nothing came
                failures = 0
                continue
            except nats.errors.Error as exc:  # broker restarting: back off, never give up
                failures += 1
                log.warning("cannot fetch trial requests (%s); retrying", exc)
                await asyncio.sleep(min(0.1 * 2**failures, self.settings.max_backoff))
                continue
            failures = 0
            if self._stopping:  # pulled while stopping: hand them straight back
                for msg in messages:
                    with contextlib.suppress(nats.errors.Error):
                        await msg.nak()
                return
            for msg in messages:
                task = asyncio.create_task(self._take(msg))
                self._taking[task] = msg
                task.add_done_callback(self._took)

    def _took(self, task: asyncio.Task) -> None:
        self._taking.pop(task, None)
        self._launch_done.set()

    async def _take(self, msg: Msg) -> None:
        """Launch one request; every path ends in exactly one ack, nak or term."""
        received = time.monotonic()
        try:
            request = TrialRequest.decode(msg.data)
        except ContractError as exc:
            log.error("terminating a malformed trial request: %s", exc)
            await msg.term()
            return
        with logs.bind(experiment=request.experiment_id, trial=request.trial_id):
            owned = self._own(request.experiment_id, request.trial_id, request.attempt)
            if owned.handle is not None:  # redelivered, but already ours
                await msg.ack()
                return
            settled = False
            try:
                try:
                    handle = await self.adapter.launch(request)
                except TransientError as exc:
                    log.info("launch will be retried in %.1fs: %s", exc.delay, exc)
                    return await self._give_back(owned, msg, exc.delay)
                except PermanentError as exc:
                    log.warning("launch failed for good: %s", exc)
                    settled = True
                    owned.outcome = TrialOutcome(TrialStatus.FAILED, message=str(exc), failure="permanent")
                    await self._report(owned)
                    return await msg.ack()
                except Exception:
                    delay = min(0.5 * 2 ** (msg.metadata.num_delivered - 1), self.settings.max_backoff)
                    log.exception("unexpected error launching the trial; retrying in %.1fs", delay)
                    return await self._give_back(owned, msg, delay)
                if handle is None:
                    self._paused_until = time.monotonic() + self.settings.capacity_backoff
                    return await self._give_back(owned, msg, self.settings.capacity_backoff)
                owned.handle = handle
                settled = True
                await msg.ack()
                self.metrics.launched.inc()
                self.metrics.launch_seconds.observe(time.monotonic() - received)
                await self._announce(owned)
            except asyncio.CancelledError:  # stopping before the platform took it: hand it back
                if not settled:
                    self._drop(owned)
                    with contextlib.suppress(nats.errors.Error):
                        await msg.nak()
                raise

    async def _give_back(self, owned: Owned, msg: Msg, delay: float) -> None:
        """Not launched: nak for later, unless a cancel came meanwhile (then it ends here)."""
        if owned.cancel is None:
            self._drop(owned)
            await msg.nak(delay=delay)
            return
        owned.outcome = TrialOutcome(owned.cancel.status, message="canceled before it started")
        await self._report(owned)
        await msg.ack()

    async def _heartbeat_loop(self) -> None:
        """Keep long launches from being redelivered to another replica."""
        while True:
            await asyncio.sleep(self.consumer.ack_wait / 3)
            for msg in list(self._taking.values()):
                with contextlib.suppress(nats.errors.Error):
                    await msg.in_progress()

    # ---------------------------------------------------------------- watching

    def _on_notify(self, handle: TrialHandle | None) -> None:
        if handle is None:
            self._poll_all = True
        else:
            self._due.add(handle)
        self._wake.set()

    async def _poll_loop(self) -> None:
        interval = self.settings.poll_interval
        next_sweep = time.monotonic() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_sweep - time.monotonic())):
                    await self._wake.wait()
            self._wake.clear()
            now = time.monotonic()
            if self._poll_all or now >= next_sweep:
                self._poll_all, self._due = False, set()
                next_sweep = now + interval
                targets = list(self.owned.values())
            else:
                due, self._due = self._due, set()
                targets = [o for h in due if (o := self.owned.get(subjects.dispatch_id(h.trial_id, h.attempt)))]
            for owned in targets:
                if owned.announced and owned.outcome is None and owned.retry_at <= now:
                    await self._poll(owned, now)

    async def _poll(self, owned: Owned, now: float) -> None:
        handle = owned.handle
        with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
            try:
                if owned.cancel is not None and not owned.cancel_sent:
                    await self._send_cancel(owned)
                outcome = await self.adapter.poll(handle)
            except TransientError as exc:
                log.warning("cannot poll the trial now (%s); retrying in %.1fs", exc, exc.delay)
                owned.retry_at = now + exc.delay
                return
            except PermanentError as exc:
                outcome = TrialOutcome(TrialStatus.FAILED, message=str(exc), failure="unknown")
            except Exception:
                log.exception("unexpected error polling the trial; retrying")
                owned.retry_at = now + self.settings.poll_interval * 4
                return
        if outcome is not None:
            owned.outcome = outcome
            self._spawn(self._report(owned, release=True), self._finishing)

    # ---------------------------------------------------------------- publishing

    async def _announce(self, owned: Owned) -> None:
        """Publish RUNNING; from then on the trial is polled (its end always follows its start)."""
        await self._publish(owned, TrialStatus.RUNNING, time=owned.handle.start_time)
        owned.announced = True
        if owned.cancel is not None:
            await self._send_cancel(owned)
        self._on_notify(owned.handle)  # it may have ended while RUNNING was on its way

    async def _report(self, owned: Owned, release: bool = False) -> None:
        """Publish the terminal event (the cancel's status if one was accepted), then release."""
        outcome = owned.outcome
        status, message = outcome.status, outcome.message
        if owned.cancel is not None:
            status, message = owned.cancel.status, owned.cancel.message or message
        await self._publish(
            owned, status, time=outcome.end_time or utcnow(), exit_code=outcome.exit_code, message=message,
            failure=outcome.failure if status is TrialStatus.FAILED else None,
        )
        self.metrics.ended.labels(self.adapter.name, status.value).inc()
        self._trial_ended.set()
        if release and owned.handle is not None:
            try:
                await self.adapter.release(owned.handle)
            except Exception:  # reported anyway; the next start adopts it and publishes a duplicate
                log.exception("cannot release the trial")
            self._recent[subjects.dispatch_id(owned.trial_id, owned.attempt)] = owned.handle
            while len(self._recent) > 1024:
                self._recent.popitem(last=False)
        self._drop(owned)

    async def _publish(self, owned: Owned, status: TrialStatus, **fields) -> None:
        """Publish one event and wait for JetStream's ack, retrying until it is stored."""
        event = TrialEvent(
            experiment_id=owned.experiment_id, trial_id=owned.trial_id, attempt=owned.attempt, status=status,
            platform=self.adapter.name, replica=self.settings.replica, **fields,
        )
        subject = subjects.events(owned.experiment_id, owned.trial_id)
        headers = {"Nats-Msg-Id": subjects.event_id(owned.trial_id, status.value, owned.attempt)}
        payload, delay = event.encode(), 0.1
        while True:
            try:
                await self._bus.js.publish(subject, payload, headers=headers)
                return
            except (nats.errors.Error, OSError) as exc:
                log.warning("cannot publish %s (%s); retrying in %.1fs", status.value, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.max_backoff)

    # ---------------------------------------------------------------- control subjects

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            request = CancelRequest.decode(msg.data)
        except ContractError as exc:
            log.warning("ignoring a malformed cancel request: %s", exc)
            return
        mine = [o for o in self.owned.values() if o.trial_id == request.trial_id]
        if not mine:
            return  # another replica owns it (or nobody): stay silent
        accepted = False
        for owned in mine:
            if owned.outcome is None:  # an attempt that already ended keeps its own status
                accepted = True
                owned.cancel = owned.cancel or request
                if owned.handle is not None and owned.announced:
                    with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
                        await self._send_cancel(owned)
        reply = CancelReply(trial_id=request.trial_id, replica=self.settings.replica, accepted=accepted)
        await self._respond(msg, reply.encode())

    async def _send_cancel(self, owned: Owned) -> None:
        """Ask the adapter to stop the trial; a failure is retried at the next poll."""
        try:
            await self.adapter.cancel(owned.handle)
            owned.cancel_sent = True
            log.info("canceling the trial (%s)", owned.cancel.status.value)
        except Exception as exc:
            log.warning("cannot cancel the trial yet (%s); retrying", exc)

    async def _on_log(self, msg: Msg) -> None:
        try:
            request = LogRequest.decode(msg.data)
        except ContractError as exc:
            log.warning("ignoring a malformed log request: %s", exc)
            return
        found = [o.handle for o in self.owned.values() if o.trial_id == request.trial_id and o.handle]
        found += [h for h in self._recent.values() if h.trial_id == request.trial_id]
        if not found:
            return
        handle = max(found, key=lambda h: h.attempt)
        try:
            text = await self.adapter.log_tail(handle, request.max_bytes)
        except Exception as exc:
            text = f"[the trial's log cannot be read: {exc}]"
        await self._respond(msg, LogReply(trial_id=request.trial_id, replica=self.settings.replica, text=text).encode())

    async def _respond(self, msg: Msg, payload: bytes) -> None:
        with contextlib.suppress(nats.errors.Error):  # the requester times out and asks again
            await msg.respond(payload)

    # ---------------------------------------------------------------- bookkeeping

    def _own(self, experiment_id: str, trial_id: str, attempt: int) -> Owned:
        key = subjects.dispatch_id(trial_id, attempt)
        if (owned := self.owned.get(key)) is None:
            owned = self.owned[key] = Owned(experiment_id, trial_id, attempt)
        return owned

    def _drop(self, owned: Owned) -> None:
        key = subjects.dispatch_id(owned.trial_id, owned.attempt)
        if self.owned.get(key) is owned:
            del self.owned[key]

    def _spawn(self, coro, group: set[asyncio.Task]) -> None:
        task = asyncio.create_task(coro)
        group.add(task)
        task.add_done_callback(group.discard)
