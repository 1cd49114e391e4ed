"""How every service starts and stops.

A service is a :class:`Service`: ``start`` brings it up (after the bus is connected and
bootstrapped), ``stop`` stops intake and finishes or hands back in-flight work. :func:`run`
owns the order, the same for every service:

    SIGTERM/SIGINT → service.stop() (stop intake, finish or nak in-flight work)
                   → bus drained → exit, all within ``stop_timeout`` seconds.

A second signal, or the deadline, exits at once with status 1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable

from contracts import sealing
from services.common import buslog, logs
from services.common.bus import Bus, NoRoom, bootstrap, connect
from services.common.settings import ServiceSettings

log = logging.getLogger(__name__)


class Service(ABC):
    """A long-running part of Trialbus. ``start`` returns once it is serving."""

    name: str

    @abstractmethod
    async def start(self, bus: Bus) -> None: ...

    @abstractmethod
    async def stop(self) -> None:
        """Stop taking work, then finish or hand back in-flight work. Must not hang."""

    def failed(self) -> BaseException | None:
        """A fatal error that should stop the process (checked while running)."""
        return None


def run(factory: Callable[[], tuple[Service, ServiceSettings]]) -> None:
    """Entry point of every ``python -m services.<name>``."""
    service, settings = factory()
    logs.setup(service.name, settings.log_level, settings.log_json)
    _install_secrets_key(service, settings)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay correct without it
        pass
    raise SystemExit(asyncio.run(_main(service, settings)))


def _install_secrets_key(service: Service, settings: ServiceSettings) -> None:
    """Give this process the key of platform secrets, if its settings have one (the
    dispatcher's and the adapters' only: clients, the web UI and the tuner never hold it)."""
    if "secrets_key" not in type(settings).model_fields:
        return
    key = getattr(settings, "secrets_key", None)
    try:
        count = sealing.install(key.get_secret_value() if key is not None else None)
    except sealing.SealingError as exc:
        raise SystemExit(f"{service.name}: {exc}") from None
    if count:
        log.info("platform secrets are sealed on the bus (%s: %d key(s))", sealing.ENV, count)
    else:
        log.warning(
            "no %s: platform secrets (tokens, passwords, keys) can be neither sealed nor unsealed here; "
            "an experiment holding one is refused, and its trials fail, saying so",
            sealing.ENV,
        )


async def _main(service: Service, settings: ServiceSettings) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stopping.is_set():
            log.warning("second signal: exiting now")
            os._exit(1)
        log.info("received %s: stopping", signal.Signals(signum).name)
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    bus = await connect(settings, service.name)
    try:
        await bootstrap(bus, settings.stream_replicas, settings.stream_limits())
    except NoRoom as no_room:
        log.error("%s cannot start: %s", service.name, no_room)
        await bus.close()
        return 1
    experiment_logs = buslog.install(bus, service.name)  # its lines about an experiment, for the web UI
    await service.start(bus)
    log.info("%s started", service.name)
    while not stopping.is_set():
        try:
            await asyncio.wait_for(stopping.wait(), timeout=0.5)
        except TimeoutError:
            if (exc := service.failed()) is not None:
                log.error("%s failed: %r", service.name, exc, exc_info=exc)
                stopping.set()
    try:
        async with asyncio.timeout(settings.stop_timeout):
            await service.stop()
            if experiment_logs is not None:
                experiment_logs.stop()
            await bus.close()
    except TimeoutError:
        log.error("%s did not stop within %.1fs; exiting anyway", service.name, settings.stop_timeout)
        return 1
    log.info("%s stopped", service.name)
    return 1 if service.failed() else 0
