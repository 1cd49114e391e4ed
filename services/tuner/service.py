"""The tuner service: runs the tuner and assessor of every experiment that names one, as a bus client.

- **Which experiments.** Those RUNNING whose config has a ``tuner`` (or NNI's older ``advisor``). An
  experiment without one is driven by its own client (``trialbus.Client``), as before.
- **One driver per experiment, any number of replicas.** A replica drives an experiment while it holds
  the experiment's lease in the ``tuners`` bucket (``kv.create`` wins it; refreshed every
  ``tuner_lease_refresh`` seconds; a replica that stops hands it back, one that dies lets it expire
  ``TUNERS_BUCKET.ttl`` seconds later, and any replica takes the experiment over). A replica restarted
  under the same name takes its leases back at once.
- **Nothing of its own to lose.** A driver rebuilds its tuner from the trials and metrics on the bus
  (:mod:`services.tuner.driver`), so a restart or a takeover resumes where the last one stopped.
- **Memory.** No trial is kept here: a driver reads its experiment's trials when it starts
  (:mod:`services.tuner.trials`), and a change of a trial reaches only its experiment's driver (the others' are
  dropped after reading their experiment id). Experiments are kept while RUNNING with a tuner. Per driven
  experiment: the driver's running trials and a bit per ended one (:mod:`~services.tuner.driver`) and the tuner's
  bounded history (:mod:`~services.tuner.history`, ``TRIALBUS_TUNER_HISTORY`` finished trials).
- **A config it cannot run stops the experiment** with the reason as its message (``trialbus
  experiment run`` checks the same before creating one, so this is for other clients), and so does a
  user's tuner, assessor or advisor class that raises, when it is loaded or later, with its traceback.
  A built-in tuner's error ends the driver, which is started again.

The ``experiments`` bucket is watched, and the ``trials`` bucket's changes followed while the replica drives an
experiment, once for all experiments; each driver gets the changes of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from fastapi import FastAPI
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from contracts import ContractError, ExperimentState, ExperimentStatus, TrialState, streams
from services.common import kvwatch
from services.common.bus import Bus
from services.common.http import HttpServer, health_routes
from services.common.lifecycle import Service
from services.common.tasks import cancel_and_wait
from services.tuner.choose import for_experiment
from services.tuner.driver import Driver, stop_experiment
from services.tuner.imports import reader
from services.tuner.protocol import ClassFailed
from services.tuner.settings import TunerSettings
from services.tuner.trials import experiment_of, follow, of_experiment

log = logging.getLogger(__name__)


class TunerService(Service):
    name = "tuner"

    def __init__(self, settings: TunerSettings) -> None:
        self.settings = settings
        self.replica = settings.replica
        self.bus: Bus | None = None
        self.experiments: dict[str, ExperimentState] = {}
        self.drivers: dict[str, Driver] = {}
        self._draining: dict[str, Driver] = {}  # ended experiments' drivers telling their tuners the last ends
        self.leases: dict[str, int] = {}  # experiment → revision of our lease entry
        self._loading: set[str] = set()  # experiments whose tuner is being built (the user's class imported)
        self._tasks: list[asyncio.Task] = []
        self._failed: BaseException | None = None
        self._kv: dict[str, KeyValue] = {}
        self._http: HttpServer | None = None
        self._unfollow: Callable[[], Awaitable[None]] | None = None  # while trial changes are followed
        self._follow_lock = asyncio.Lock()
        self._stopped = False

    @property
    def _bus(self) -> Bus:
        """The bus, for what runs once started (watches, drivers, following trials)."""
        if self.bus is None:
            raise RuntimeError("the tuner service is not started")
        return self.bus

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        for bucket in ("trials", "experiments", streams.TUNERS_BUCKET.bucket):
            self._kv[bucket] = await bus.kv(bucket)
        experiments_loaded = asyncio.Event()
        self._tasks = [asyncio.create_task(self._watch("experiments", self._on_experiment, experiments_loaded))]
        await experiments_loaded.wait()
        self._tasks.append(asyncio.create_task(self._keep_leases()))
        if self.settings.tuner_http_port is not None:
            app = FastAPI()
            app.include_router(
                health_routes(lambda: self.bus, lambda: {"replica": self.replica, "experiments": sorted(self.drivers)})
            )
            self._http = HttpServer(app, self.settings.tuner_http_host, self.settings.tuner_http_port)
            await self._http.start()
        log.info("tuner replica %s: %d experiments to drive", self.replica, len(self.drivers))

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.stop()
        await cancel_and_wait(self._tasks)
        async with self._follow_lock:
            self._stopped = True
            if self._unfollow is not None:
                unfollow, self._unfollow = self._unfollow, None
                await unfollow()
        for experiment_id in list(self.drivers):
            await self._release(experiment_id, delete=True)  # another replica (or our restart) takes it at once

    def failed(self) -> BaseException | None:
        return self._failed or (self._http.failed() if self._http is not None else None)

    # ------------------------------------------------------------------ watching

    async def _watch(self, bucket: str, apply, loaded: asyncio.Event) -> None:
        try:
            async with contextlib.aclosing(kvwatch.watch(self._bus, bucket)) as entries:
                async for entry in entries:
                    if entry is None:  # the current values are in: updates follow
                        loaded.set()
                        continue
                    if not entry.value:
                        continue
                    try:
                        await apply(entry.value)
                    except ContractError as exc:
                        log.warning("skipping an unreadable %s entry %s: %s", bucket, entry.key, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the watch is the service's input: without it, restart
            self._failed = exc
            loaded.set()

    async def _on_trial(self, raw: bytes) -> None:
        """A trial changed: its driver's, if we drive its experiment; decoded only then."""
        experiment_id = experiment_of(raw)
        if experiment_id is None:
            return
        driver = self.drivers.get(experiment_id) or self._draining.get(experiment_id)
        if driver is None:
            return
        try:
            driver.on_trial(TrialState.decode(raw))
        except ContractError as exc:
            log.warning("skipping an unreadable trial of experiment %s: %s", experiment_id, exc)

    async def _on_experiment(self, raw: bytes) -> None:
        state = ExperimentState.decode(raw)
        if self._wants(state):
            self.experiments[state.id] = state
        else:  # ended, or no tuner: nothing to drive
            self.experiments.pop(state.id, None)
        if (driver := self.drivers.get(state.id)) is not None:
            if state.status != ExperimentStatus.RUNNING:
                await self._release(state.id, delete=True, ended=True)
            else:
                driver.on_experiment(state)
        elif self._wants(state):
            await self._claim(state)

    @staticmethod
    def _wants(state: ExperimentState) -> bool:
        return state.status == ExperimentStatus.RUNNING and bool(state.config.tuner or state.config.advisor)

    # -------------------------------------------------------------------- leases

    async def _claim(self, state: ExperimentState) -> None:
        if state.id in self._loading:
            return
        kv = self._kv[streams.TUNERS_BUCKET.bucket]
        try:
            revision = await kv.create(state.id, self.replica.encode())
        except KeyWrongLastSequenceError:  # held: by us before a restart, or by another replica
            try:
                entry = await kv.get(state.id)
            except KeyNotFoundError:
                return  # expired meanwhile: the next round claims it
            if entry.value != self.replica.encode() or entry.revision is None:
                return
            try:
                revision = await kv.update(state.id, self.replica.encode(), last=entry.revision)
            except KeyWrongLastSequenceError:
                return
        except nats.errors.Error as exc:
            log.warning("could not claim experiment %s: %s", state.id, exc)
            return
        self.leases[state.id] = revision
        await self._drive(state)

    async def _drive(self, state: ExperimentState) -> None:
        self._loading.add(state.id)
        try:
            tuner = await asyncio.to_thread(
                for_experiment,
                state.config,  # imports the user's class, if any
                history=self.settings.tuner_history,
            )
        except (ValueError, ClassFailed) as exc:
            message = (
                exc.message("the tuner cannot run: ")
                if isinstance(exc, ClassFailed)
                else f"the tuner cannot run: {exc}"
            )
            log.error("experiment %s: %s", state.id, exc if isinstance(exc, ClassFailed) else message)
            await stop_experiment(self._bus, state.id, message, self.settings.tuner_api_timeout, retry=False)
            await self._release(state.id, delete=True)
            return
        finally:
            self._loading.discard(state.id)
        # Not kept: it ended while the tuner was built. The driver then tells the tuner the ends and closes it.
        latest = self.experiments.get(state.id) or state.model_copy(update={"status": ExperimentStatus.STOPPED})
        built = state.config.search_space
        changed = latest.config.search_space != built  # `trialbus update searchspace` while the tuner was built
        driver = Driver(
            self._bus,
            latest.model_copy(update={"config": latest.config.model_copy(update={"search_space": built})}),
            tuner,
            of_experiment(self._bus, state.id, self.settings.tuner_api_timeout),
            self.settings.tuner_api_timeout,
            imports=reader(self._bus, state.id),
        )
        if changed:
            driver.on_experiment(latest)  # the tuner gets the new space before it proposes
        self.drivers[state.id] = driver
        await self._follow_while_driving()  # before the driver reads its trials
        await driver.start()
        log.info("driving experiment %s (%s)", state.id, type(tuner).__name__)
        if latest.status != ExperimentStatus.RUNNING or state.id not in self.leases:  # it ended, or the lease went
            await self._release(
                state.id,
                delete=latest.status != ExperimentStatus.RUNNING,
                ended=latest.status != ExperimentStatus.RUNNING,
            )

    async def _release(self, experiment_id: str, *, delete: bool, ended: bool = False) -> None:
        driver = self.drivers.pop(experiment_id, None)
        if driver is not None:
            self._draining[experiment_id] = driver  # it still hears of its trials while it tells the last ends
            try:
                await driver.stop(ended=ended)
            finally:
                self._draining.pop(experiment_id, None)
            await self._follow_while_driving()
        revision = self.leases.pop(experiment_id, None)
        if delete and revision is not None:
            with contextlib.suppress(nats.errors.Error, KeyWrongLastSequenceError):
                await self._kv[streams.TUNERS_BUCKET.bucket].delete(experiment_id, last=revision)

    async def _follow_while_driving(self) -> None:
        """Follow the ``trials`` bucket's changes while this replica drives an experiment, and only
        then: a replica with nothing to drive reads no trial change at all."""
        async with self._follow_lock:
            driving = bool(self.drivers or self._draining) and not self._stopped
            if driving and self._unfollow is None:
                self._unfollow = await follow(self._bus, self._on_trial)
            elif not driving and self._unfollow is not None:
                unfollow, self._unfollow = self._unfollow, None
                await unfollow()

    async def _keep_leases(self) -> None:
        """Refresh our leases, drop the ones lost, and claim experiments whose holder is gone."""
        kv = self._kv[streams.TUNERS_BUCKET.bucket]
        while True:
            await asyncio.sleep(self.settings.tuner_lease_refresh)
            for experiment_id, revision in list(self.leases.items()):
                driver = self.drivers.get(experiment_id)
                if driver is not None and (error := driver.done()) is not None:
                    log.error("experiment %s: the driver failed (%r); restarting it", experiment_id, error)
                    await self._release(experiment_id, delete=False)
                    if (state := self.experiments.get(experiment_id)) is not None:
                        await self._claim(state)
                    continue
                try:
                    self.leases[experiment_id] = await kv.update(experiment_id, self.replica.encode(), last=revision)
                except KeyWrongLastSequenceError:
                    log.warning("experiment %s: lost the lease to another tuner replica", experiment_id)
                    await self._release(experiment_id, delete=False)
                except nats.errors.Error as exc:
                    log.warning("could not refresh the lease of experiment %s: %s", experiment_id, exc)
            for state in list(self.experiments.values()):
                if state.id not in self.drivers and self._wants(state):
                    await self._claim(state)
