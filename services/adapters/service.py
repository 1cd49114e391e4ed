"""The service every platform adapter runs under: all adapter policy, written once.

:class:`AdapterService` turns a :class:`~services.adapters.base.PlatformAdapter` into a
Trialbus service. This module takes work in and answers control requests;
:mod:`services.adapters.trials` watches owned trials and publishes their events.
Guarantees, for every platform:

- **One work queue, many replicas.** All replicas share the durable pull consumer
  ``adapter-<name>`` on ``dispatch.<name>``; each request goes to one replica at a time.
- **Ack only once owned.** A request is acked after ``launch`` returned a handle (the
  platform owns the trial and this replica tracks it), and is heartbeated
  (``in_progress``) while a launch takes long. No capacity or a TransientError naks it
  with a delay; a PermanentError publishes FAILED, then acks; a malformed one is terminated.
- **Events are never lost**, and a trial's end never overtakes its start (see ``trials``).
- **The owner answers.** Every replica listens on ``control.<name>.cancel`` and
  ``control.<name>.log``; only the replica that owns the trial replies. A cancel that
  arrives while the trial is still launching takes effect once it is launched (or ends
  it unlaunched, if the platform then refuses it).
- **Waiting is visible and quick.** A request the platform has no room for yet
  (:class:`~services.adapters.errors.Waiting`, e.g. its GPUs are taken) is held unacked,
  its reason published as a WAITING event, and offered to ``launch`` again the moment a
  trial ends or the adapter reports freed capacity; after ``wait_hold`` seconds it goes
  back to the queue so another replica may take it. Held requests do not count against
  ``launch_concurrency``: a trial that fits is never stuck behind one that waits.
- **Capacity is published.** Every ``status_interval`` (and soon after a change) the
  replica writes its :class:`~contracts.PlatformStatus` to the ``platforms`` bucket
  (``GET /api/v1/platforms``); it deletes it when it stops.
- **Trials outlive the service.** Stop (SIGTERM) stops intake, naks what was pulled but
  not launched, unsubscribes and returns, leaving trials running for the next start.
- **A drain preempts.** ``control.<name>.drain`` naming this replica (``trialbus platform
  drain``) stops intake (what is held or launching goes back to the queue) and stops every
  trial it runs as a preemption: SIGTERM, the trial's grace period, SIGKILL, then SYS_CANCELED
  with failure ``preempted``, which the dispatcher runs again (on another replica while this
  one drains). Undrained, it takes trials again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

import nats.errors
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter, Histogram

from contracts import (
    CancelReply,
    CancelRequest,
    CheckReply,
    CheckRequest,
    ContractError,
    DrainReply,
    DrainRequest,
    LogReply,
    LogRequest,
    PlatformStatus,
    TrialRequest,
    TrialStatus,
    sealing,
    streams,
    subjects,
)
from contracts.base import utcnow
from services.adapters.base import AdapterSettings, PlatformAdapter, TrialOutcome
from services.adapters.errors import PermanentError, TransientError, Waiting
from services.adapters.trials import Owned, OwnedTrials
from services.common import logs
from services.common.bus import Bus
from services.common.lifecycle import Service

__all__ = ["AdapterService", "AdapterSettings"]

log = logging.getLogger(__name__)

#: Seconds one fetch waits for work. Stop waits for the fetch in flight rather than
#: cancelling it, so a message the server hands out at that moment is nak'ed, not stranded.
FETCH_WAIT = 0.5
#: Seconds between two status writes at least, however often capacity changes.
STATUS_MIN_GAP = 0.25


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


class Signal:
    """Wakes every waiter at once; each ``fire`` starts a new round."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()


class AdapterService(Service):
    """Runs one :class:`PlatformAdapter` on the bus (see the module docstring)."""

    def __init__(
        self, adapter: PlatformAdapter, settings: AdapterSettings, registry: CollectorRegistry | None = None
    ) -> None:
        self.adapter = adapter
        self.settings = settings
        self.name = f"adapter-{adapter.name}"
        self.registry = registry or CollectorRegistry()
        self.metrics = AdapterMetrics(self.registry, adapter.name)
        self.consumer = streams.adapter_consumer(adapter.name)
        self.trials = OwnedTrials(adapter, settings, self.metrics.ended)
        self._bus: Bus | None = None
        self._pull = None
        self._subs: list = []
        self._taking: dict[asyncio.Task, Msg] = {}  # launches in flight, with their messages
        self._held: dict[asyncio.Task, Msg] = {}  # requests waiting for capacity (Waiting)
        self._held_keys: dict[asyncio.Task, str] = {}
        #: Fired when capacity may have freed: a trial ended, the adapter said so, a cancel came.
        self.capacity = Signal()
        self._status_due = asyncio.Event()
        self._platforms = None  # the platforms KV bucket
        self._loops: list[asyncio.Task] = []
        self._launch_done = asyncio.Event()
        self._paused_until = 0.0
        self._stopping = False
        self.draining = False
        self._http = None

    @property
    def owned(self) -> dict[str, Owned]:
        """The trial attempts this replica owns, by ``<trial>:<attempt>``."""
        return self.trials.by_key

    @property
    def http_port(self) -> int | None:
        """The port ``/healthz`` and ``/metrics`` are served on, once started (None: not served)."""
        return self._http.port if self._http is not None else None

    def _health(self) -> dict:
        """``/healthz`` beyond NATS: the trials it runs, ``idle`` while it has none, and what the
        platform says of itself (e.g. that no cluster is configured yet)."""
        return {"trials": len(self.owned), "idle": not self.owned, **self.adapter.health()}

    # ---------------------------------------------------------------- lifecycle

    async def start(self, bus: Bus) -> None:
        self._bus = self.trials.bus = bus
        await self.adapter.start(bus)
        self.adapter.listen(self.trials.notify, self._capacity_changed, self.trials.adopt)
        self.trials.on_end = self._capacity_changed
        adopted = await self.adapter.adopt()
        for handle in adopted:
            self.trials.adopt(handle)
        if adopted:
            log.info("adopted %d trial(s) from a previous run", len(adopted))
        await bus.js.add_consumer(streams.DISPATCH.name, self.consumer)
        self._pull = await bus.js.pull_subscribe_bind(self.consumer.durable_name, stream=streams.DISPATCH.name)
        self._subs = [
            await bus.nc.subscribe(subjects.control(self.adapter.name, "cancel"), cb=self._on_cancel),
            await bus.nc.subscribe(subjects.control(self.adapter.name, "log"), cb=self._on_log),
            await bus.nc.subscribe(subjects.control(self.adapter.name, "check"), queue="check", cb=self._on_check),
            await bus.nc.subscribe(subjects.control(self.adapter.name, "drain"), cb=self._on_drain),
        ]
        if self.settings.adapter_http_port is not None:
            from fastapi import FastAPI

            from services.common.http import HttpServer, health_routes

            app = FastAPI()
            app.include_router(health_routes(lambda: self._bus, self._health))
            self._http = HttpServer(app, self.settings.adapter_http_host, self.settings.adapter_http_port)
            await self._http.start()
        self._platforms = await bus.kv(streams.PLATFORMS_BUCKET.bucket)
        loops = (self._fetch_loop, self.trials.watch, self._heartbeat_loop, self._status_loop)
        self._loops = [asyncio.create_task(c()) for c in loops]

    async def stop(self) -> None:
        """Stop intake, nak unlaunched work, leave trials running; bounded by ``stop_timeout``."""
        self._stopping = True
        grace = min(5.0, self.settings.stop_timeout / 3)
        if self._loops:  # let the fetch in flight return (and nak) its messages, then stop every loop
            await asyncio.wait(self._loops[:1], timeout=FETCH_WAIT + 0.5)
        for task in self._loops:
            task.cancel()
        for task in self._held:  # waiting requests go back to the queue at once
            task.cancel()
        for group in (self._taking, self._held, self.trials.reporting):  # launches first: nothing new is owned
            if group:
                _, late = await asyncio.wait(list(group), timeout=grace)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(*self._loops, return_exceptions=True)
        for sub in [*self._subs, *([self._pull] if self._pull is not None else [])]:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self.adapter.listen(None)
        await self.adapter.stop()
        with contextlib.suppress(nats.errors.Error, OSError):  # else it expires with the bucket's ttl
            await self._platforms.delete(subjects.platform_key(self.adapter.name, self.settings.replica))
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
                self.trials.trial_ended.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self.trials.trial_ended.wait()
                self._paused_until = 0.0
                continue
            if self.draining:  # takes nothing until undrained
                await asyncio.sleep(FETCH_WAIT)
                continue
            free = self.settings.launch_concurrency - len(self._taking)
            if free <= 0:
                self._launch_done.clear()
                await self._launch_done.wait()
                continue
            try:
                messages = await self._pull.fetch(free, timeout=FETCH_WAIT)
            except TimeoutError:  # nothing came (nats-py raises nats' or asyncio's TimeoutError)
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
        if self._held.pop(task, None) is not None:
            self._held_keys.pop(task, None)
        self._status_due.set()  # launched, handed back or ended: the published status changes
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
            owned = self.trials.own(request.experiment_id, request.trial_id, request.attempt)
            if owned.handle is not None:  # redelivered, but already ours
                await msg.ack()
                return
            settled = False
            try:
                while True:  # more than one round only for a request that waits for capacity
                    if self.draining:  # pulled before the drain: another replica may run it
                        return await self._give_back(owned, msg, 0.0)
                    try:
                        if (unreadable := sealing.unreadable(request)) is not None:  # no key, or not the dispatcher's
                            raise PermanentError(f"the trial's secrets cannot be read here: {unreadable}")
                        handle = await self.adapter.launch(request)
                    except Waiting as exc:
                        if await self._wait(owned, msg, str(exc), received):
                            continue
                        return
                    except TransientError as exc:
                        log.info("launch will be retried in %.1fs: %s", exc.delay, exc)
                        return await self._give_back(owned, msg, exc.delay)
                    except PermanentError as exc:
                        log.warning("launch failed for good: %s", exc)
                        settled = True
                        owned.outcome = TrialOutcome(TrialStatus.FAILED, message=str(exc), failure="permanent")
                        await self.trials.report(owned)
                        return await msg.ack()
                    except Exception:
                        delay = min(0.5 * 2 ** (msg.metadata.num_delivered - 1), self.settings.max_backoff)
                        log.exception("unexpected error launching the trial; retrying in %.1fs", delay)
                        return await self._give_back(owned, msg, delay)
                    break
                if handle is None:
                    self._paused_until = time.monotonic() + self.settings.capacity_backoff
                    return await self._give_back(owned, msg, self.settings.capacity_backoff)
                owned.handle = handle
                settled = True
                if self.draining and owned.cancel is None:  # launched as the drain came: preempted too
                    owned.cancel = self._preemption(owned)
                await msg.ack()
                self.metrics.launched.inc()
                self.metrics.launch_seconds.observe(time.monotonic() - received)
                await self.trials.announce(owned)
            except asyncio.CancelledError:  # stopping before the platform took it: hand it back
                if not settled:
                    self.trials.drop(owned)
                    with contextlib.suppress(nats.errors.Error):
                        await msg.nak()
                raise

    async def _wait(self, owned: Owned, msg: Msg, reason: str, received: float) -> bool:
        """Hold a request that waits for capacity; True to offer it to ``launch`` again.

        The first wait moves the request out of ``launch_concurrency`` (so intake goes on)
        and publishes its reason. It is offered again when capacity may have freed, and
        handed back to the queue after ``wait_hold`` seconds or when it is canceled.
        """
        task = asyncio.current_task()
        if task in self._taking:
            self._held[task] = self._taking.pop(task)
            self._held_keys[task] = subjects.dispatch_id(owned.trial_id, owned.attempt)
            self._launch_done.set()
            self._status_due.set()
        if owned.waiting != reason:
            owned.waiting = reason
            await self.trials.waiting(owned, reason)
        remaining = received + self.settings.wait_hold - time.monotonic()
        if owned.cancel is not None or remaining <= 0 or self._stopping or self.draining:
            await self._give_back(owned, msg, 0.0)
            return False
        await self.capacity.wait(remaining)
        if owned.cancel is not None:  # canceled while held: end it, never launch it
            await self._give_back(owned, msg, 0.0)
            return False
        return True

    def _capacity_changed(self) -> None:
        self.capacity.fire()
        self._status_due.set()

    async def _give_back(self, owned: Owned, msg: Msg, delay: float) -> None:
        """Not launched: nak for later, unless a cancel came meanwhile (then it ends here)."""
        if owned.cancel is None:
            self.trials.drop(owned)
            await msg.nak(delay=delay)
            return
        owned.outcome = TrialOutcome(owned.cancel.status, message="canceled before it started")
        await self.trials.report(owned)
        await msg.ack()

    async def _heartbeat_loop(self) -> None:
        """Keep long launches from being redelivered to another replica."""
        while True:
            await asyncio.sleep(self.consumer.ack_wait / 3)
            for msg in [*self._taking.values(), *self._held.values()]:
                with contextlib.suppress(nats.errors.Error):
                    await msg.in_progress()

    async def _status_loop(self) -> None:
        """Publish this replica's :class:`PlatformStatus` every ``status_interval`` and
        shortly after a change (at most every ``STATUS_MIN_GAP`` seconds)."""
        key = subjects.platform_key(self.adapter.name, self.settings.replica)
        host = socket.gethostname()
        while True:
            self._status_due.clear()
            try:
                status = PlatformStatus(
                    adapter=self.adapter.name, replica=self.settings.replica, host=host, time=utcnow(),
                    running=sum(1 for o in self.owned.values() if o.handle is not None and o.outcome is None),
                    waiting=list(dict.fromkeys(self._held_keys.values())), draining=self.draining,
                    **self.adapter.describe(),
                )
                await self._platforms.put(key, status.encode())
            except (nats.errors.Error, OSError) as exc:  # the broker restarts: next round
                log.debug("cannot publish the platform status: %s", exc)
            except Exception:  # a bug in describe() must not stop the adapter
                log.exception("cannot build the platform status")
            await asyncio.sleep(STATUS_MIN_GAP)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.settings.status_interval - STATUS_MIN_GAP)):
                    await self._status_due.wait()

    # ---------------------------------------------------------------- control subjects

    async def _on_cancel(self, msg: Msg) -> None:
        if (request := _decode(CancelRequest, msg)) is None:
            return
        if request.replica is not None and request.replica != self.settings.replica:
            return  # meant for another replica's copy
        mine = [o for o in self.trials.of_trial(request.trial_id) if request.attempt in (None, o.attempt)]
        if not mine:
            return  # another replica owns it (or nobody): stay silent
        accepted = False
        for owned in mine:
            if owned.outcome is None:  # an attempt that already ended keeps its own status
                accepted = True
                owned.cancel = owned.cancel or request
                if owned.announced:  # else: sent once launched and announced
                    with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
                        await self.trials.send_cancel(owned)
                elif owned.waiting is not None:  # held for capacity: end it now
                    self.capacity.fire()
        reply = CancelReply(trial_id=request.trial_id, replica=self.settings.replica, accepted=accepted)
        await self._respond(msg, reply)

    async def _on_drain(self, msg: Msg) -> None:
        if (request := _decode(DrainRequest, msg)) is None or request.replica != self.settings.replica:
            return  # another replica's: it answers
        self.draining, preempted = request.drain, 0
        log.warning("draining: no more trials here, and the running ones are preempted" if request.drain
                    else "undrained: taking trials again")  # fmt: skip
        if request.drain:
            for owned in list(self.owned.values()):
                if owned.outcome is not None or owned.cancel is not None or owned.handle is None:
                    continue  # ended, being stopped already, or still launching (preempted once launched)
                owned.cancel = self._preemption(owned)
                preempted += 1
                if owned.announced:
                    with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
                        await self.trials.send_cancel(owned)
            self.capacity.fire()  # held requests go back to the queue
        self._status_due.set()
        reply = DrainReply(replica=self.settings.replica, draining=self.draining, preempted=preempted)
        await self._respond(msg, reply)

    def _preemption(self, owned: Owned) -> CancelRequest:
        why = f"preempted: adapter replica {self.settings.replica} is draining"
        return CancelRequest(experiment_id=owned.experiment_id, trial_id=owned.trial_id,
                             status=TrialStatus.SYS_CANCELED, message=why, preempt=True)  # fmt: skip

    async def _on_log(self, msg: Msg) -> None:
        if (request := _decode(LogRequest, msg)) is None:
            return
        handle = self.trials.latest_handle(request.trial_id)
        if handle is None:
            try:
                handle = await self.adapter.past(request.experiment_id, request.trial_id)
            except Exception:
                log.exception("cannot look for the logs of trial %s", request.trial_id)
        if handle is None:
            return
        try:
            text = await self.adapter.log_tail(handle, request.max_bytes)
        except Exception as exc:
            text = f"[the trial's log cannot be read: {exc}]"
        await self._respond(msg, LogReply(trial_id=request.trial_id, replica=self.settings.replica, text=text))

    async def _on_check(self, msg: Msg) -> None:
        if (request := _decode(CheckRequest, msg)) is None:
            return
        try:
            if (unreadable := sealing.unreadable(request)) is not None:
                problems = [f"the {self.adapter.name} adapter cannot read the experiment's secrets: {unreadable}"]
            else:
                problems = await self.adapter.check(request.training_service)
        except Exception as exc:  # a bug must not block creating experiments
            log.exception("cannot check a training service")
            problems = [f"the {self.adapter.name} adapter could not check the platform: {exc}"]
        await self._respond(msg, CheckReply(replica=self.settings.replica, problems=problems))

    async def _respond(self, msg: Msg, reply: CancelReply | LogReply | CheckReply | DrainReply) -> None:
        with contextlib.suppress(nats.errors.Error):  # the requester times out and asks again
            await msg.respond(reply.encode())


_Control = CancelRequest | LogRequest | CheckRequest | DrainRequest


def _decode(model: type[_Control], msg: Msg) -> _Control | None:
    """A control request, or None (logged) when it is malformed: nobody answers it."""
    try:
        return model.decode(msg.data)
    except ContractError as exc:
        log.warning("ignoring a malformed %s on %s: %s", model.__name__, msg.subject, exc)
        return None
