"""The experiment's own logs: the dispatcher's and the tuner's lines about it, from the LOGS stream.

The services publish them (:mod:`services.common.buslog`) on ``logs.<experiment>.<service>``; the stream keeps
the last 1,000 lines of each service per experiment (``contracts.streams.LOGS``), so a read is bounded
whatever the experiment's size: at most 2,000 messages are read, the newest :data:`MAX_LINES` sent.

    GET /api/experiments/{id}/logs[?lines=n]         the last n lines (default and at most 1,000), oldest first
    GET /api/experiments/{id}/logs/stream[?lines=n]  server-sent ``lines`` events: the last n lines, then the
                                                     new ones as they are logged (a burst in one event)

Each line: ``{"seq", "time", "service", "level", "logger", "message"[, "trial"]}``, ``seq`` the stream's
sequence (the order they were logged in, across services). Lines hold no secret (buslog's rule); the search
space and the config (secrets masked) the Logs view shows are the overview's (``GET /api/experiments/{id}``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

import nats.errors
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from contracts import streams, subjects
from services.common import openapi as doc
from services.common.bus import Bus
from services.webui.actions import Refused
from services.webui.hub import Hub, followed, frame
from services.webui.openapi import READ, event_stream

#: Lines a read sends at most (and by default).
MAX_LINES = 1000
#: Seconds the history may take to arrive; seconds between two events of new lines (a burst is one event).
READ_TIMEOUT, COALESCE = 5.0, 0.25


def line_of(msg: Msg) -> dict[str, Any] | None:
    """A published line with its stream sequence; None for one that is not a JSON object."""
    try:
        line = orjson.loads(msg.data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(line, dict):
        return None
    line["seq"] = msg.metadata.sequence.stream
    return line


class Follower:
    """One experiment's lines: the history (:meth:`start`), then the new ones (:meth:`take`). O(lines kept)."""

    def __init__(self, bus: Bus, experiment_id: str, lines: int) -> None:
        self.bus, self.subject, self.lines = bus, subjects.logs(experiment_id), lines
        self.fresh: list[dict[str, Any]] = []
        #: Set when new lines wait in :meth:`take`, or when the follower is closed.
        self.ready = asyncio.Event()
        self.closed = False
        self._sub: Any = None
        self._remaining = 0
        self._history: deque[dict[str, Any]] = deque(maxlen=lines)
        self._loaded = asyncio.Event()

    async def start(self) -> list[dict[str, Any]]:
        """The last ``lines`` lines now in the stream, oldest first; new ones are gathered from then on."""
        info = await self.bus.js.stream_info(streams.stream_name(streams.LOGS), subjects_filter=self.subject)
        self._remaining = sum((info.state.subjects or {}).values())  # ≤ 1,000 per service: the stream's limit
        if not self._remaining:
            self._loaded.set()
        self._sub = await self.bus.js.subscribe(
            self.subject,
            stream=streams.LOGS.name,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            cb=self._on_message,
        )
        await asyncio.wait_for(self._loaded.wait(), READ_TIMEOUT)
        history, self._history = list(self._history), deque(maxlen=self.lines)
        return history

    async def _on_message(self, msg: Msg) -> None:
        line = line_of(msg)
        if not self._loaded.is_set():
            if line is not None:
                self._history.append(line)
            self._remaining -= 1
            # the count read first, or nothing pending: lines the stream's limit dropped meanwhile never come
            if self._remaining <= 0 or msg.metadata.num_pending == 0:
                self._loaded.set()
        elif line is not None:
            self.fresh = [*self.fresh[-(self.lines - 1) :], line]
            self.ready.set()

    def take(self) -> list[dict[str, Any]]:
        fresh, self.fresh = self.fresh, []
        self.ready.clear()
        return fresh

    def close(self) -> None:
        """End the stream (the web UI stops): :meth:`stop` still unsubscribes."""
        self.closed = True
        self.ready.set()

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None


def lines_wanted(request: Request) -> int:
    raw = request.query_params.get("lines", str(MAX_LINES))
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= MAX_LINES:
        raise Refused(400, f"lines must be a whole number from 1 to {MAX_LINES}, not {raw!r}")
    return int(raw)


def routes(api: APIRouter, known: Callable[[str], Any], bus: Callable[[], Bus | None], hub: Hub) -> None:
    """The two routes (module docstring) on ``api``; ``known(id)`` raises the 404 of an unknown experiment;
    ``hub`` ends the streams when the web UI stops and runs their cleanups."""

    def connected() -> Bus:
        current = bus()
        if current is None or not current.nc.is_connected:
            raise Refused(503, "NATS is unavailable; retry in a moment")
        return current

    @api.get("/experiments/{experiment_id}/logs", responses=doc.refusals(*READ, 404, 503, 504))
    async def experiment_logs(experiment_id: str, request: Request) -> Response:
        """The dispatcher's and the tuner's last lines about the experiment, oldest first (at most 1,000)."""
        known(experiment_id)
        follower = Follower(connected(), experiment_id, lines_wanted(request))
        try:
            lines = await follower.start()
        except (TimeoutError, nats.errors.Error) as exc:
            raise Refused(504, f"the LOGS stream did not deliver experiment {experiment_id}'s lines ({exc})") from None
        finally:
            await follower.stop()
        return Response(
            orjson.dumps({"lines": lines}), media_type="application/json", headers={"Cache-Control": "no-store"}
        )

    @api.get(
        "/experiments/{experiment_id}/logs/stream",
        responses=event_stream("the experiment's log lines: the last ones, then each new one", *READ, 404, 503),
    )
    async def experiment_log_stream(experiment_id: str, request: Request) -> StreamingResponse:
        """Server-sent ``lines`` events: the last lines, then the new ones as they are logged."""
        known(experiment_id)
        follower = Follower(connected(), experiment_id, lines_wanted(request))

        frames = followed(
            hub,
            follower,
            "LOGS",
            lambda lines: frame("lines", {"lines": lines, "history": True}),
            lambda lines: frame("lines", {"lines": lines}),
            COALESCE,
        )

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(frames, media_type="text/event-stream", headers=headers)
