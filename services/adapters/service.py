"""The service every platform adapter runs under: all adapter policy, written once.

:class:`AdapterService` turns a :class:`~services.adapters.base.PlatformAdapter` into a
Trialbus service. It is a facade that makes, starts and stops its parts:
:mod:`services.adapters.intake` takes work in, :mod:`services.adapters.control` answers
control requests, :mod:`services.adapters.drain` drains the replica,
:mod:`services.adapters.trials` watches owned trials and publishes their events,
:mod:`services.adapters.claims` fences attempts, :mod:`services.adapters.status` publishes
the replica's status and :mod:`services.adapters.spot` watches a spot VM's notice.
Guarantees, for every platform:

- **One work queue, many replicas.** All replicas share the durable pull consumer
  ``adapter-<name>`` on ``dispatch.<name>``; each request goes to one replica at a time.
- **Ack only once owned.** A request is acked after ``launch`` returned a handle (the
  platform owns the trial and this replica tracks it), and is heartbeated
  (``in_progress``) while a launch takes long. No capacity or a TransientError naks it
  with a delay; a PermanentError publishes FAILED, then acks; a malformed one is terminated.
- **One copy of an attempt.** Each launch first claims ``<adapter>.<trial>.<attempt>`` in the
  ``claims`` bucket (``services.adapters.claims``): a request delivered again to another
  replica is acked there without a launch while the holder is alive, and taken over when
  the holder is gone.
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
  one drains). Undrained, it takes trials again. With ``spot_notice`` set, a spot VM's notice
  from the cloud drains the replica the same way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.adapters import claims, spot
from services.adapters.base import AdapterSettings, PlatformAdapter
from services.adapters.control import ControlRequests
from services.adapters.drain import Drain
from services.adapters.intake import FETCH_WAIT, Intake, Signal, settle
from services.adapters.status import StatusPublisher
from services.adapters.trials import Owned, OwnedTrials
from services.common.bus import Bus
from services.common.lifecycle import Service
from services.common.tasks import cancel_and_wait, first_failure

if TYPE_CHECKING:  # imported when served (fastapi and uvicorn load slowly)
    from services.common.http import HttpServer

__all__ = ["AdapterService", "AdapterSettings"]

log = logging.getLogger(__name__)


class AdapterMetrics:
    """Prometheus metrics of one adapter service, on the registry it is given."""

    def __init__(self, registry: CollectorRegistry, platform: str) -> None:
        self.launched = Counter(
            "trialbus_adapter_trials_launched", "Trial attempts launched", ["platform"], registry=registry
        ).labels(platform)
        self.ended = Counter(
            "trialbus_adapter_trials_ended",
            "Trial attempts ended, by status",
            ["platform", "status"],
            registry=registry,
        )
        self.launch_seconds = Histogram(
            "trialbus_adapter_launch_seconds",
            "Seconds from pulling a request to the trial launched",
            ["platform"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        ).labels(platform)


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
        self.trials = OwnedTrials(adapter, settings, self.metrics.ended)
        self.claims = claims.Claims(adapter.name, settings.replica)
        #: Fired when capacity may have freed: a trial ended, the adapter said so, a cancel came.
        self.capacity = Signal()
        self.status = StatusPublisher(adapter.name, settings.replica, settings.status_interval, self._status_fields)
        self.drainer = Drain(self.trials, self.capacity.fire, self.status.due)
        self.intake = Intake(
            adapter,
            settings,
            self.trials,
            self.claims,
            self.drainer,
            self.capacity,
            self.status.due,
            self.metrics.launched,
            self.metrics.launch_seconds,
        )
        self.control = ControlRequests(adapter, settings.replica, self.trials, self.drainer, self.capacity.fire)
        self._bus: Bus | None = None
        self._loops: list[asyncio.Task] = []
        self._http: HttpServer | None = None

    @property
    def owned(self) -> dict[str, Owned]:
        """The trial attempts this replica owns, by ``<trial>:<attempt>``."""
        return self.trials.by_key

    @property
    def draining(self) -> bool:
        """Whether this replica drains (takes no trials)."""
        return self.drainer.active

    @property
    def http_port(self) -> int | None:
        """The port ``/healthz`` and ``/metrics`` are served on, once started (None: not served)."""
        return self._http.port if self._http is not None else None

    def _health(self) -> dict:
        """``/healthz`` beyond NATS: the trials it runs, ``idle`` while it has none, and what the
        platform says of itself (e.g. that no cluster is configured yet)."""
        return {"trials": len(self.owned), "idle": not self.owned, **self.adapter.health()}

    def _status_fields(self) -> dict:
        """This replica's status beyond its name (:class:`StatusPublisher`)."""
        running = sum(1 for o in self.owned.values() if o.handle is not None and o.outcome is None)
        return {
            "running": running,
            "waiting": self.intake.waiting(),
            "draining": self.drainer.active,
            **self.adapter.describe(),
        }

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
        await self.intake.start(bus)
        await self.control.start(bus)
        if self.settings.adapter_http_port is not None:
            from fastapi import FastAPI

            from services.common.http import HttpServer, health_routes

            app = FastAPI()
            app.include_router(health_routes(lambda: self._bus, self._health))
            self._http = http = HttpServer(app, self.settings.adapter_http_host, self.settings.adapter_http_port)
            await http.start()
        await self.status.start(bus)
        await self.claims.start(bus)
        loops = [self.intake.run, self.trials.watch, self.intake.heartbeat, self.status.run]
        if self.settings.spot_notice is not None:
            watcher = spot.SpotWatcher(
                self.settings.spot_notice,
                self.settings.spot_notice_url,
                self.settings.spot_notice_interval,
                self._spot_notice,
            )
            loops.append(watcher.run)
        self._loops = [asyncio.create_task(c()) for c in loops]

    async def stop(self) -> None:
        """Stop intake, nak unlaunched work, leave trials running; bounded by ``stop_timeout``."""
        self.intake.stopping = True
        grace = min(5.0, self.settings.stop_timeout / 3)
        if self._loops:  # let the fetch in flight return (and nak) its messages, then stop every loop
            await asyncio.wait(self._loops[:1], timeout=FETCH_WAIT + 0.5)
        for task in self._loops:
            task.cancel()
        await self.intake.hand_back(grace)  # launches first: nothing new is owned
        await settle(self.trials.reporting, grace)
        await cancel_and_wait(self._loops)
        await self.control.stop()
        await self.intake.close()
        self.adapter.listen(None)
        await self.adapter.stop()
        await self.status.delete()
        if self._http is not None:
            await self._http.stop()

    async def drain(self, drain: bool, why: str) -> int:
        """Drain (no new trials here; each running one preempted, saying ``why``) or undrain;
        how many trials were preempted."""
        return await self.drainer.set(drain, why)

    async def _spot_notice(self, why: str) -> None:
        await self.drain(True, f"this machine is a spot instance the cloud reclaims ({why})")

    def _capacity_changed(self) -> None:
        self.capacity.fire()
        self.status.due()

    def failed(self) -> BaseException | None:
        return first_failure(self._loops) or (self._http.failed() if self._http is not None else None)
