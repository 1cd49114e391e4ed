"""The trials one adapter replica owns, from launch until their end is published.

:class:`OwnedTrials` is the watching and reporting half of the adapter service
(:mod:`services.adapters.service` is the intake half). It guarantees:

- A trial's RUNNING event is published before it is polled, so its end never overtakes
  its start on the bus. The one exception: a launched attempt that the platform's own queue
  holds (:meth:`~services.adapters.base.PlatformAdapter.queued`, Kueue on Kubernetes) stays
  WAITING with the queue's reason and is polled meanwhile, so a cancel reaches it and its end
  (canceled, deleted, failed) may come without a start; RUNNING follows once it leaves the queue.
- Every event is published with JetStream's ack and retried until the broker stores it
  (the broker may restart mid-run). A trial is released only after its terminal event is
  stored; if the service stops first, the next start adopts it and publishes again —
  harmless, the dedupe id ``<trial>:<status>:<attempt>`` drops the duplicate.
- An accepted cancel decides the status the trial ends with (USER_CANCELED or
  EARLY_STOPPED), whatever the platform saw.
- ``notify(handle)`` from the adapter polls that trial at once; every trial is also
  polled every ``poll_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import nats.errors
from prometheus_client import Counter

from contracts import CancelRequest, TrialEvent, TrialStatus, subjects
from contracts.base import utcnow
from services.adapters.base import AdapterSettings, PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, Stale, TransientError
from services.common import logs
from services.common.bus import Bus

log = logging.getLogger(__name__)

#: Released trials remembered for log requests (newest kept).
RECENT = 1024


@dataclass(eq=False)
class Owned:
    """A trial attempt this replica owns: launching, running, or ended and not yet reported."""

    experiment_id: str
    trial_id: str
    attempt: int
    handle: TrialHandle | None = None  # None while launching
    announced: bool = False  # RUNNING published: only then is it polled (or while queued)
    queued: str | None = None  # launched, held in the platform's own queue: the reason published (WAITING)
    cancel: CancelRequest | None = None  # accepted cancel: the status it ends with
    cancel_sent: bool = False  # adapter.cancel succeeded
    outcome: TrialOutcome | None = None  # ended: the terminal event is being published
    waiting: str | None = None  # held for capacity: the reason last published
    note: str | None = None  # running, but its status is stale: the message last published
    retry_at: float = 0.0  # monotonic time before which it is not polled (after a poll error)
    claim: str | None = None  # its key in the claims bucket, once this replica claimed it


class OwnedTrials:
    """Owned trials by dispatch id ``<trial>:<attempt>``; run :meth:`watch` as a task."""

    def __init__(self, adapter: PlatformAdapter, settings: AdapterSettings, ended: Counter) -> None:
        self.adapter, self.settings, self._ended_count = adapter, settings, ended
        self.bus: Bus | None = None
        self.by_key: dict[str, Owned] = {}
        #: The same by trial id (its attempts owned here): a cancel or log request finds them in O(1).
        self._by_trial: dict[str, dict[int, Owned]] = {}
        #: Set whenever a trial ends: platform capacity may have freed.
        self.trial_ended = asyncio.Event()
        #: Tasks publishing events (stop waits for them, bounded).
        self.reporting: set[asyncio.Task] = set()
        self._recent: OrderedDict[str, TrialHandle] = OrderedDict()
        self._wake = asyncio.Event()
        self._due: set[TrialHandle] = set()
        self._poll_all = True
        #: Called when a trial ends (its capacity is free again).
        self.on_end: Callable[[], None] = lambda: None

    def own(self, experiment_id: str, trial_id: str, attempt: int) -> Owned:
        key = subjects.dispatch_id(trial_id, attempt)
        if (owned := self.by_key.get(key)) is None:
            owned = self.by_key[key] = Owned(experiment_id, trial_id, attempt)
            self._by_trial.setdefault(trial_id, {})[attempt] = owned
        return owned

    def drop(self, owned: Owned) -> None:
        key = subjects.dispatch_id(owned.trial_id, owned.attempt)
        if self.by_key.get(key) is owned:
            del self.by_key[key]
            attempts = self._by_trial[owned.trial_id]
            del attempts[owned.attempt]
            if not attempts:
                del self._by_trial[owned.trial_id]

    def of_trial(self, trial_id: str) -> list[Owned]:
        """The trial's attempts owned here: O(its attempts)."""
        return list(self._by_trial.get(trial_id, {}).values())

    def latest_handle(self, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        """The newest attempt's handle (or ``attempt``'s), owned or recently released (for log requests)."""
        found = [o.handle for o in self.of_trial(trial_id) if o.handle is not None]
        found += [h for h in self._recent.values() if h.trial_id == trial_id]
        found = [h for h in found if attempt in (None, h.attempt)]
        return max(found, key=lambda h: h.attempt) if found else None

    def adopt(self, handle: TrialHandle) -> None:
        """A trial left by a previous run: announce it again (deduped), then watch it."""
        owned = self.own(handle.experiment_id, handle.trial_id, handle.attempt)
        owned.handle = handle
        self._spawn(self.announce(owned))

    # ------------------------------------------------------------------ watching

    def notify(self, handle: TrialHandle | None) -> None:
        """The adapter's :meth:`~PlatformAdapter.notify`: poll this trial (or all) now."""
        if handle is None:
            self._poll_all = True
        else:
            self._due.add(handle)
        self._wake.set()

    async def watch(self) -> None:
        """Poll trials: the notified ones at once, all of them every ``poll_interval``."""
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
                targets = list(self.by_key.values())
            else:
                due, self._due = self._due, set()
                targets = [o for h in due if (o := self.by_key.get(subjects.dispatch_id(h.trial_id, h.attempt)))]
            for owned in targets:
                watched = owned.announced or owned.queued is not None
                if watched and owned.outcome is None and owned.retry_at <= now:
                    await self._poll(owned, now)

    async def _poll(self, owned: Owned, now: float) -> None:
        assert owned.handle is not None  # polled once announced or queued, both once launched
        with logs.bind(experiment=owned.experiment_id, trial=owned.trial_id):
            try:
                if owned.cancel is not None and not owned.cancel_sent:
                    await self.send_cancel(owned)
                if not owned.announced and not await self._queued(owned):  # it left the platform's queue
                    await self._running(owned)
                outcome = await self.adapter.poll(owned.handle)
            except Stale as exc:
                owned.retry_at = now + exc.delay
                if owned.announced and owned.note != str(exc):  # a note is a RUNNING event
                    owned.note = str(exc)
                    self._spawn(self.note(owned, owned.note))
                return
            except TransientError as exc:
                log.warning("cannot poll the trial now (%s); retrying in %.1fs", exc, exc.delay)
                owned.retry_at = now + exc.delay
                return
            except PermanentError as exc:  # the platform lost it and says so
                outcome = TrialOutcome(TrialStatus.FAILED, message=str(exc), failure="infrastructure")
            except Exception:
                log.exception("unexpected error polling the trial; retrying")
                owned.retry_at = now + self.settings.poll_interval * 4
                return
        if outcome is None and owned.note is not None:  # answered again: its status is current
            self._spawn(self.note(owned, None, after=owned.note))
            owned.note = None
        if outcome is not None:
            owned.outcome = outcome
            self._spawn(self.report(owned, release=True))

    async def send_cancel(self, owned: Owned) -> None:
        """Ask the adapter to stop the trial; a failure is retried at the next poll."""
        handle, cancel = owned.handle, owned.cancel
        assert handle is not None and cancel is not None  # sent for an accepted cancel, once announced or queued
        try:
            await self.adapter.cancel(handle)
            owned.cancel_sent = True
            log.info("canceling the trial (%s)", cancel.status.value)
        except Exception as exc:
            log.warning("cannot cancel the trial yet (%s); retrying", exc)

    # ------------------------------------------------------------------ reporting

    async def announce(self, owned: Owned) -> None:
        """Publish RUNNING; from then on the trial is polled (its end always follows its start). Its dedupe
        id names this replica: a second copy of the attempt elsewhere is seen, and stopped, by the dispatcher.
        While the platform's own queue holds it: WAITING with the queue's reason instead (polled meanwhile)."""
        assert owned.handle is not None  # announced once launched (or adopted)
        if not await self._queued(owned):
            await self._running(owned)

    async def _running(self, owned: Owned) -> None:
        assert owned.handle is not None  # announced once launched (or adopted)
        msg_id = subjects.running_event_id(owned.trial_id, owned.attempt, self.settings.replica)
        await self.publish(owned, TrialStatus.RUNNING, msg_id=msg_id, time=owned.handle.start_time)
        owned.announced = True
        if owned.cancel is not None and not owned.cancel_sent:  # (sent already while it was queued)
            await self.send_cancel(owned)
        self.notify(owned.handle)  # it may have ended while RUNNING was on its way

    async def _queued(self, owned: Owned) -> bool:
        """Whether the platform's own queue still holds the attempt; WAITING published for each new reason.
        When the platform cannot tell now, the trial stays as it was (queued, or about to run)."""
        assert owned.handle is not None  # asked once launched
        try:
            reason = await self.adapter.queued(owned.handle)
        except (TransientError, PermanentError) as exc:
            log.info("cannot tell whether the platform still queues the trial: %s", exc)
            return owned.queued is not None
        except Exception:
            log.exception("unexpected error asking whether the platform still queues the trial")
            return owned.queued is not None
        if reason is None:
            if owned.queued is not None:  # it starts now, not when it was handed to the platform's queue
                owned.handle = replace(owned.handle, start_time=utcnow())
            owned.queued = None
            return False
        if owned.queued != reason:
            owned.queued = reason
            await self.waiting(owned, reason)
        return True

    async def report(self, owned: Owned, release: bool = False) -> None:
        """Publish the terminal event (the cancel's status if one was accepted), then release."""
        outcome = owned.outcome
        assert outcome is not None  # reported once it ended
        status, message = outcome.status, outcome.message
        failure = outcome.failure if status is TrialStatus.FAILED else None
        if owned.cancel is not None:
            status, message = owned.cancel.status, owned.cancel.message or message
            failure = "preempted" if owned.cancel.preempt else None  # a preemption runs again
        last_error = outcome.last_error if status is TrialStatus.FAILED else None
        await self.publish(
            owned,
            status,
            time=outcome.end_time or utcnow(),
            exit_code=outcome.exit_code,
            message=message,
            failure=failure,
            last_error=last_error,
        )
        self._ended_count.labels(self.adapter.name, status.value).inc()
        self.trial_ended.set()
        self.on_end()
        if release and owned.handle is not None:
            try:
                await self.adapter.release(owned.handle)
            except Exception:  # reported anyway; the next start adopts it and publishes a duplicate
                log.exception("cannot release the trial")
            self._recent[subjects.dispatch_id(owned.trial_id, owned.attempt)] = owned.handle
            while len(self._recent) > RECENT:
                self._recent.popitem(last=False)
        self.drop(owned)

    async def note(self, owned: Owned, message: str | None, after: str | None = None) -> None:
        """RUNNING again with a message on it (its status is stale, and why), or without one
        once it is current again (``after`` the stale note); each note has its own dedupe id."""
        assert owned.handle is not None  # noted while polled: announced, so launched
        key = message if message is not None else f"current again after: {after}"
        msg_id = subjects.note_event_id(owned.trial_id, owned.attempt, key)
        await self.publish(owned, TrialStatus.RUNNING, msg_id=msg_id, time=owned.handle.start_time, message=message)

    async def waiting(self, owned: Owned, reason: str) -> None:
        """Publish WAITING with what the trial waits for (one event per distinct reason)."""
        log.info("the trial waits: %s", reason)
        msg_id = subjects.waiting_event_id(owned.trial_id, owned.attempt, reason)
        await self.publish(owned, TrialStatus.WAITING, msg_id=msg_id, time=utcnow(), message=reason)

    async def publish(self, owned: Owned, status: TrialStatus, msg_id: str | None = None, **fields) -> None:
        """Publish one event and wait for JetStream's ack, retrying until it is stored."""
        event = TrialEvent(
            experiment_id=owned.experiment_id,
            trial_id=owned.trial_id,
            attempt=owned.attempt,
            status=status,
            platform=self.adapter.name,
            replica=self.settings.replica,
            **fields,
        )
        subject = subjects.events(owned.experiment_id, owned.trial_id, self.adapter.name)  # its own only
        headers = {"Nats-Msg-Id": msg_id or subjects.event_id(owned.trial_id, status.value, owned.attempt)}
        payload, delay = event.encode(), 0.1
        assert self.bus is not None  # the service hands it over before it owns any trial
        while True:
            try:
                await self.bus.js.publish(subject, payload, headers=headers)
                return
            except (nats.errors.Error, OSError) as exc:
                log.warning("cannot publish %s (%s); retrying in %.1fs", status.value, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.max_backoff)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.reporting.add(task)
        task.add_done_callback(self.reporting.discard)
