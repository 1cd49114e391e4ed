"""The platform adapter plug-in point: what a platform implements, and the types it uses.

A :class:`PlatformAdapter` knows how to start, watch and stop one trial on one compute
platform, and nothing else. Every policy decision — when a dispatch message is acked,
nak'ed or terminated, which event is published when, which replica answers a cancel,
what survives a restart — lives once in :class:`~services.adapters.service.AdapterService`
(the consume loop), so a new platform is one small class (``docs/adding-a-platform.md``)
and every platform behaves the same on the bus. ``services/adapters/fake`` is the
in-memory reference implementation; ``tests/contract`` the suite every adapter passes.

Call order, as :class:`AdapterService` guarantees it::

    start(bus) ─► adopt() ─► launch / poll / cancel / log_tail / release, concurrently,
                             for many trials ─► stop()

Nothing is called before ``start`` returns or after ``stop`` is called. All calls come
from one event loop; an adapter needs no locks against the service, only against itself
(two launches of the same trial may run concurrently: see :meth:`PlatformAdapter.launch`).
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Literal, TypeVar

from pydantic import Field, SecretStr

from contracts import TrainingService, TrialRequest, TrialStatus
from contracts.base import utcnow
from services.adapters.errors import PermanentError, TransientError
from services.common.bus import Bus
from services.common.settings import ServiceSettings

__all__ = [
    "AdapterSettings",
    "PermanentError",
    "PlatformAdapter",
    "TransientError",
    "TrialHandle",
    "TrialOutcome",
    "find_attempt",
]

#: Why an attempt failed, for the dispatcher's retry policy (:data:`contracts.retries.Failure`).
Failure = Literal["trial", "infrastructure", "preempted", "lost", "permanent"]


class AdapterSettings(ServiceSettings):
    """Settings of every adapter service (``TRIALBUS_<NAME>``); a platform's settings extend it."""

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
    adapter_http_port: int | None = Field(default=None, ge=0, le=65535)
    #: Address the health and metrics endpoints bind to.
    adapter_http_host: str = "127.0.0.1"
    #: Seconds a request that waits for capacity (``Waiting``) is held before it goes back
    #: to the queue, where another replica may take it.
    wait_hold: float = Field(default=2.0, gt=0)
    #: Seconds between two writes of this replica's status to the ``platforms`` bucket.
    status_interval: float = Field(default=5.0, gt=0, le=20)
    #: The dispatcher's TRIALBUS_SECRETS_KEY (Fernet key(s), comma-separated): unseals the
    #: platform secrets and trial tokens of the requests. Without it such trials fail, saying so.
    secrets_key: SecretStr | None = None
    #: On a spot / preemptible VM: whose notice to watch (``aws``, ``gcp``, ``azure``); on a notice
    #: the replica drains itself, preempting its trials (``services.adapters.spot``).
    spot_notice: Literal["aws", "gcp", "azure"] | None = None
    #: The instance metadata service's address (default http://169.254.169.254).
    spot_notice_url: str | None = None
    #: Seconds between two looks at the notice.
    spot_notice_interval: float = Field(default=5.0, gt=0)


@dataclass(frozen=True)
class TrialHandle:
    """One attempt of one trial as its adapter knows it; hashable, compared on ids and ``ref``."""

    experiment_id: str
    trial_id: str
    attempt: int
    #: The platform's own name for the run (a trial directory, a job name): opaque to the service.
    ref: str
    #: When the trial started on the platform; the RUNNING event carries it.
    start_time: datetime = field(default_factory=utcnow, compare=False)


T = TypeVar("T")


def find_attempt(attempts: Mapping[tuple[str, int], T], handle: TrialHandle) -> T:
    """What an adapter tracks of a handle's attempt, in its table by ``(trial id, attempt)``;
    PermanentError when this replica does not track it (another replica's, or released)."""
    found = attempts.get((handle.trial_id, handle.attempt))
    if found is None:
        raise PermanentError(f"trial {handle.trial_id} attempt {handle.attempt} is not known to this replica")
    return found


@dataclass(frozen=True)
class TrialOutcome:
    """How an attempt ended, as the platform saw it."""

    #: A terminal status: SUCCEEDED or FAILED from the platform; the service maps canceled trials.
    status: TrialStatus
    #: The trial command's exit code; negative for a signal (``-9`` = SIGKILL); None if unknown.
    exit_code: int | None = None
    #: A sentence for people: why it failed. Never contains secrets.
    message: str | None = None
    #: Why it failed, for the dispatcher's retry policy: the trial's own failure, its infrastructure's
    #: (OpenPAI's exit spec, a machine or keeper gone), a preemption…; None when it succeeded.
    failure: Failure | None = None
    #: When it ended on the platform (now when unknown).
    end_time: datetime | None = None
    #: A failed trial's last stderr line (the keeper's ``lastError``), where the platform can read it.
    last_error: str | None = None

    @classmethod
    def exited(cls, exit_code: int, end_time: datetime | None = None, note: str | None = None) -> TrialOutcome:
        """The outcome of a command that exited: 0 succeeded, anything else failed (NNI's rule)."""
        if exit_code == 0:
            return cls(TrialStatus.SUCCEEDED, 0, note, None, end_time)
        how = f"killed by signal {-exit_code}" if exit_code < 0 else f"exited with code {exit_code}"
        message = f"trial command {how}" + (f"; {note}" if note else "")
        return cls(TrialStatus.FAILED, exit_code, message, "trial", end_time)


class PlatformAdapter(ABC):
    """One compute platform: launch, watch and stop trials there.

    Subclasses set :attr:`name` and implement :meth:`launch`, :meth:`poll` and
    :meth:`cancel`; everything else has a safe default. Raise
    :class:`~services.adapters.errors.TransientError` to be retried later and
    :class:`~services.adapters.errors.PermanentError` to fail the attempt; never retry
    or publish anything yourself.
    """

    #: The adapter's name: its work queue is ``dispatch.<name>``, its control subjects
    #: ``control.<name>.*``. It is ``TrainingService.adapter`` of the platforms it runs.
    name: ClassVar[str]

    _listener: Callable[[TrialHandle | None], None] | None = None
    _capacity_listener: Callable[[], None] | None = None
    _found_listener: Callable[[TrialHandle], None] | None = None

    async def start(self, bus: Bus) -> None:
        """Open clients and check that the platform is usable; called once, first.

        ``bus`` is for reading the ``code`` object store (``bus.code_store()``); the service
        alone consumes and publishes. Raise PermanentError if the platform cannot be used.
        """

    async def stop(self) -> None:
        """Close clients; called once, last. Must NOT stop trials: they outlive the adapter,
        and the next start of this replica adopts them."""

    async def adopt(self) -> list[TrialHandle]:
        """Trials a previous run of this replica launched and never released.

        Called once, after :meth:`start` and before the first launch. Return both the
        running ones and the ones that ended while no adapter watched (their real end is
        then reported by :meth:`poll`). The service republishes RUNNING for each; the
        event dedupe ids make that safe.
        """
        return []

    @abstractmethod
    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        """Start one attempt of a trial and return its handle once the platform owns it.

        Idempotent per ``(trial_id, attempt)``: launching an attempt that this replica
        already launched — in this run, a previous run, or concurrently — returns the
        existing handle and never runs the trial twice, even when it has ended since.
        Return ``None`` when the platform has no capacity now: the request is redelivered
        later. Raise :class:`~services.adapters.errors.Waiting` instead when users should
        see why and the trial should start the moment room frees (GPU placement). The
        service acks the dispatch message only after this returns a handle, and heartbeats
        it while the launch takes long.
        """

    @abstractmethod
    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        """``None`` while the attempt runs; its :class:`TrialOutcome` once it has ended.

        Called every ``poll_interval`` and as soon as :meth:`notify` names the handle,
        until it returns an outcome. Must be cheap. A trial the platform lost is an
        outcome (FAILED, with why), not an error; raise only when you cannot tell.
        """

    async def queued(self, handle: TrialHandle) -> str | None:
        """Why the platform's own queue still holds a launched attempt (Kueue admits its pods,
        say), or None once it may run. Asked before RUNNING is published: while it answers a
        reason the trial stays WAITING with that reason (and is polled, so a cancel or an end
        still reaches it); RUNNING follows the first None. Raise as :meth:`poll` does."""
        return None

    @abstractmethod
    async def cancel(self, handle: TrialHandle) -> None:
        """Begin stopping the attempt and return; a later :meth:`poll` reports its end.

        Canceling an attempt that has already ended is not an error. The service maps
        the end to the cancel's status (USER_CANCELED or EARLY_STOPPED).
        """

    async def release(self, handle: TrialHandle) -> None:
        """The attempt's end is published: forget it, so :meth:`adopt` will not return it
        again (e.g. write a "reported" marker). Not called if publishing never succeeded."""

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        """A released attempt this replica still keeps the logs of (``attempt``, or the newest),
        for log requests about trials that ended before this run; None when it has none."""
        return None

    async def check(self, service: TrainingService) -> list[str]:
        """What stops this platform from running an experiment with this ``trainingService``
        (unreachable machines, refused credentials), one sentence each; asked when the
        experiment is created, so users hear of it at once rather than from a failed trial."""
        return []

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        """The last ``max_bytes`` of the trial's stdout and stderr, labelled, for people."""
        return ""

    def notify(self, handle: TrialHandle | None = None) -> None:
        """Ask for :meth:`poll` now, e.g. when the platform says a trial exited.

        With a handle only that trial is polled; ``None`` polls all. Without this the end
        of a trial is noticed only at the next ``poll_interval``. Call it from the event
        loop's thread (use ``loop.call_soon_threadsafe`` from other threads); it is cheap
        and may be called any number of times.
        """
        if self._listener is not None:
            self._listener(handle)

    def capacity_freed(self) -> None:
        """Say that room may have freed outside any trial's end (a foreign process left a
        GPU): requests held by :class:`~services.adapters.errors.Waiting` are offered again."""
        if self._capacity_listener is not None:
            self._capacity_listener()

    def found(self, handle: TrialHandle) -> None:
        """Hand over a trial that :meth:`adopt` could not return (its machine was unreachable
        at start): the service announces it and watches it like an adopted one."""
        if self._found_listener is not None:
            self._found_listener(handle)

    def health(self) -> dict:
        """Fields of this replica's ``/healthz`` (cheap, no I/O): e.g. why it waits, idle,
        for its platform's configuration. A replica without configuration still starts, and
        takes only the experiments it can run."""
        return {}

    def describe(self) -> dict:
        """Platform fields of this replica's :class:`~contracts.PlatformStatus` (``maxTrials``,
        GPUs…), published every few seconds; must be cheap (no I/O)."""
        return {}

    def listen(
        self,
        callback: Callable[[TrialHandle | None], None] | None,
        capacity: Callable[[], None] | None = None,
        found: Callable[[TrialHandle], None] | None = None,
    ) -> None:
        """Used by the service (and tests) to receive :meth:`notify`, :meth:`capacity_freed`
        and :meth:`found` calls."""
        self._listener, self._capacity_listener, self._found_listener = callback, capacity, found
