"""A service's log lines about an experiment, published on the LOGS stream for the web UI's Logs view.

Which lines: those that name an experiment, in any of three ways (the first found wins):

- ``extra={"experiment": id}`` on the log call (the record's ``experiment`` attribute);
- inside :func:`services.common.logs.bind` with ``experiment=id`` (the tuner's driver runs in one);
- the house wording ``log.info("experiment %s created …", experiment_id)``: a message whose template says
  ``experiment %s`` is about the argument in that place (``driving experiment %s``, ``could not stop
  experiment %s: %s``…).

Each line goes to ``logs.<experiment>.<service>`` as JSON ``{"time", "service", "level", "logger", "message"}``
(plus ``trial`` when bound), the message cut to :data:`MAX_MESSAGE` characters. The stream keeps the last
1,000 lines per subject (``contracts.streams.LOGS``), so an experiment's logs are bounded however long it runs.

Logging never waits for NATS: a line is queued (at most :data:`QUEUE` of them; more are dropped and counted) and
one task publishes them, core NATS, fire and forget. Lines logged on other threads (the tuner's calls) are
handed to the loop. Log lines hold no secret (configs log masked, tokens never): keep it so, as these reach
anyone who may read the experiment.

Only the services in :data:`SERVICES` publish (their NATS users may, ``k8s/base/nats/auth.conf``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from datetime import UTC, datetime

import orjson

from contracts import subjects
from services.common.bus import Bus
from services.common.logs import bound

__all__ = ["MAX_MESSAGE", "QUEUE", "SERVICES", "ExperimentLogs", "experiment_of", "install"]

#: The services whose lines about an experiment are published (the dispatcher's and the tuner's).
SERVICES = frozenset({"dispatcher", "tuner"})
#: The longest message published, in characters (a user's tuner traceback is cut, its end kept).
MAX_MESSAGE = 4000
#: Lines waiting to be published at most; past it, new lines are dropped (and counted).
QUEUE = 10_000

_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa%]")


def experiment_of(record: logging.LogRecord) -> str | None:
    """The experiment the line is about (module docstring), or None."""
    named = getattr(record, "experiment", None)
    if isinstance(named, str) and named:
        return named
    context = bound().get("experiment")
    if context:
        return context
    template, args = record.msg, record.args
    if not isinstance(template, str) or not isinstance(args, tuple) or "experiment %s" not in template:
        return None
    before = template[: template.index("experiment %s")]
    position = sum(1 for match in _PLACEHOLDER.finditer(before) if match.group() != "%%")
    value = args[position] if position < len(args) else None
    return value if isinstance(value, str) and value and "." not in value and " " not in value else None


class ExperimentLogs(logging.Handler):
    """Publishes the lines about an experiment (module docstring) on the bus; :meth:`stop` stops it.

    Not :meth:`close`: ``logging.config.dictConfig`` (uvicorn's, as an HTTP server starts) closes every handler
    and goes on logging through them, so a handler that stopped on close would go quiet for good."""

    def __init__(self, bus: Bus, service: str) -> None:
        super().__init__(logging.INFO)
        self.bus = bus
        self.service = service
        self.dropped = 0
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(QUEUE)
        self._task = self._loop.create_task(self._publish(), name=f"{service}-experiment-logs")

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("nats"):
            return  # the client's own lines, maybe about this very publishing
        experiment = experiment_of(record)
        if experiment is None:
            return
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: the stderr handler reports it
            return
        if len(message) > MAX_MESSAGE:
            message = "…" + message[-(MAX_MESSAGE - 1) :]
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "service": self.service,
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        if trial := bound().get("trial"):
            line["trial"] = trial
        item = (subjects.logs(experiment, self.service), orjson.dumps(line))
        if threading.get_ident() == self._loop_thread:
            self._put(item)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is ending
                self._loop.call_soon_threadsafe(self._put, item)

    def _put(self, item: tuple[str, bytes]) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _publish(self) -> None:
        while True:
            subject, data = await self._queue.get()
            try:
                await self.bus.nc.publish(subject, data)
            except Exception:  # noqa: S112 - NATS away or closing: a log line is not worth more
                self.dropped += 1

    def stop(self) -> None:
        logging.getLogger().removeHandler(self)
        self._task.cancel()


def install(bus: Bus, service: str) -> ExperimentLogs | None:
    """Publish ``service``'s lines about experiments from now on (the services of :data:`SERVICES` only)."""
    if service not in SERVICES:
        return None
    handler = ExperimentLogs(bus, service)
    logging.getLogger().addHandler(handler)
    return handler
