"""Taking trial requests in: pull, claim, launch, hold while waiting for capacity, hand back.

Every path of a request ends in exactly one ack, nak or term (see the guarantees in
:mod:`services.adapters.service`): acked once the platform owns the trial, or once it is
known to run on another replica (:mod:`services.adapters.claims`); nak'ed with a delay when
it cannot be launched now; FAILED then acked when it never can; terminated when malformed.

:class:`Intake` is a part of :class:`~services.adapters.service.AdapterService`: it owns the
work queue's pull subscription and the requests in flight (launching, or held for capacity),
and hands what it launches to :class:`~services.adapters.trials.OwnedTrials`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import Counter, Histogram

from contracts import ContractError, TrialRequest, TrialStatus, sealing, streams, subjects
from services.adapters import claims
from services.adapters.base import AdapterSettings, PlatformAdapter, TrialOutcome
from services.adapters.drain import Drain
from services.adapters.errors import PermanentError, TransientError, Waiting
from services.adapters.trials import Owned, OwnedTrials
from services.common import logs
from services.common.bus import Bus
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Seconds one fetch waits for work. Stop waits for the fetch in flight rather than
#: cancelling it, so a message the server hands out at that moment is nak'ed, not stranded.
FETCH_WAIT = 0.5


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


async def settle(tasks: Collection[asyncio.Task], grace: float) -> None:
    """Let the tasks finish for up to ``grace`` seconds, then cancel the late ones."""
    if tasks:
        _, late = await asyncio.wait(list(tasks), timeout=grace)
        await cancel_and_wait(late)


class Intake:
    """The request path of the adapter service (see the module docstring).

    ``capacity`` wakes the held requests; ``changed`` says the published status changed; the
    two metrics count launches and time them.
    """

    def __init__(
        self,
        adapter: PlatformAdapter,
        settings: AdapterSettings,
        trials: OwnedTrials,
        claims_: claims.Claims,
        drain: Drain,
        capacity: Signal,
        changed: Callable[[], None],
        launched: Counter,
        launch_seconds: Histogram,
    ) -> None:
        self.adapter, self.settings, self.trials, self.claims = adapter, settings, trials, claims_
        self.drain, self.capacity, self._changed = drain, capacity, changed
        self._launched, self._launch_seconds = launched, launch_seconds
        self.consumer = streams.adapter_consumer(adapter.name)
        self._pull: JetStreamContext.PullSubscription | None = None
        self._taking: dict[asyncio.Task, Msg] = {}  # launches in flight, with their messages
        self._held: dict[asyncio.Task, Msg] = {}  # requests waiting for capacity (Waiting)
        self._held_keys: dict[asyncio.Task, str] = {}
        self._launch_done = asyncio.Event()
        self._paused_until = 0.0
        self.stopping = False

    async def start(self, bus: Bus) -> None:
        """Bind to the adapter's durable consumer on the work queue."""
        await bus.js.add_consumer(streams.stream_name(streams.DISPATCH), self.consumer)
        self._pull = await bus.js.pull_subscribe_bind(self.consumer.durable_name, stream=streams.DISPATCH.name)

    def waiting(self) -> list[str]:
        """The dispatch ids of the requests held for capacity."""
        return list(dict.fromkeys(self._held_keys.values()))

    async def hand_back(self, grace: float) -> None:
        """Stopping: held requests go back to the queue at once; launches finish (or are
        cancelled, and go back) within ``grace`` seconds."""
        for task in self._held:
            task.cancel()
        for group in (self._taking, self._held):  # launches first: nothing new is owned
            await settle(group, grace)

    async def close(self) -> None:
        if self._pull is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._pull.unsubscribe()

    async def heartbeat(self) -> None:
        """Keep long launches from being redelivered to another replica."""
        if (ack_wait := self.consumer.ack_wait) is None:  # optional in nats.py's types; adapter_consumer sets it
            raise ValueError(f"consumer definition without an ack wait: {self.consumer}")
        while True:
            await asyncio.sleep(ack_wait / 3)
            for msg in [*self._taking.values(), *self._held.values()]:
                with contextlib.suppress(nats.errors.Error):
                    await msg.in_progress()

    async def run(self) -> None:
        """Pull requests while there is room to launch them, until stopping."""
        if (pull := self._pull) is None:
            raise RuntimeError("the intake is not started")
        failures = 0
        while not self.stopping:
            if (pause := self._paused_until - time.monotonic()) > 0:  # the platform was full
                self.trials.trial_ended.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self.trials.trial_ended.wait()
                self._paused_until = 0.0
                continue
            if self.drain.active:  # takes nothing until undrained
                await asyncio.sleep(FETCH_WAIT)
                continue
            free = self.settings.launch_concurrency - len(self._taking)
            if free <= 0:
                self._launch_done.clear()
                await self._launch_done.wait()
                continue
            try:
                messages = await pull.fetch(free, timeout=FETCH_WAIT)
            except TimeoutError:  # nothing came (nats-py raises nats' or asyncio's TimeoutError)
                failures = 0
                continue
            except nats.errors.Error as exc:  # broker restarting: back off, never give up
                failures += 1
                log.warning("cannot fetch trial requests (%s); retrying", exc)
                await asyncio.sleep(min(0.1 * 2**failures, self.settings.max_backoff))
                continue
            failures = 0
            if self.stopping:  # pulled while stopping: hand them straight back
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
        self._changed()  # launched, handed back or ended: the published status changes
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
                    if self.drain.active:  # pulled before the drain: another replica may run it
                        return await self._give_back(owned, msg, 0.0)
                    if owned.claim is None and not await self._claim(owned, request, msg):
                        return
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
                if self.drain.active and owned.cancel is None:  # launched as the drain came: preempted too
                    owned.cancel = self.drain.preemption(owned)
                await msg.ack()
                self._launched.inc()
                self._launch_seconds.observe(time.monotonic() - received)
                await self.trials.announce(owned)
            except asyncio.CancelledError:  # stopping before the platform took it: hand it back
                if not settled:
                    self.trials.drop(owned)
                    if owned.claim is not None and asyncio.current_task() in self._held:
                        # Held for capacity, never launched: another replica may take it at once, as
                        # _give_back lets it (a launch cut short keeps its claim: it may have begun).
                        with contextlib.suppress(nats.errors.Error):
                            await self.claims.drop(owned.claim)
                        owned.claim = None
                    with contextlib.suppress(nats.errors.Error):
                        await msg.nak()
                raise

    async def _claim(self, owned: Owned, request: TrialRequest, msg: Msg) -> bool:
        """Claim the attempt before launching it (``claims``); False when the request is settled
        here instead: another replica runs it (acked) or is still launching it (back for later)."""
        try:
            elsewhere = await self.claims.take(request)
        except nats.errors.Error as exc:
            log.warning("cannot claim the attempt (%s); retrying in %.1fs", exc, claims.RECHECK)
            await self._give_back(owned, msg, claims.RECHECK)
            return False
        if elsewhere is None:
            owned.claim = self.claims.key(request)
            return True
        self.trials.drop(owned)
        if elsewhere.done:
            log.info("not launching a second copy: %s", elsewhere.why)
            await msg.ack()
        else:
            await msg.nak(delay=claims.RECHECK)
        return False

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
            self._changed()
        if owned.waiting != reason:
            owned.waiting = reason
            await self.trials.waiting(owned, reason)
        remaining = received + self.settings.wait_hold - time.monotonic()
        if owned.cancel is not None or remaining <= 0 or self.stopping or self.drain.active:
            await self._give_back(owned, msg, 0.0)
            return False
        await self.capacity.wait(remaining)
        if owned.cancel is not None:  # canceled while held: end it, never launch it
            await self._give_back(owned, msg, 0.0)
            return False
        return True

    async def _give_back(self, owned: Owned, msg: Msg, delay: float) -> None:
        """Not launched: nak for later, unless a cancel came meanwhile (then it ends here)."""
        if owned.cancel is None:
            self.trials.drop(owned)
            if owned.claim is not None:  # unlaunched: another replica may take it at once
                await self.claims.drop(owned.claim)
                owned.claim = None
            await msg.nak(delay=delay)
            return
        owned.outcome = TrialOutcome(owned.cancel.status, message="canceled before it started")
        await self.trials.report(owned)
        await msg.ack()
