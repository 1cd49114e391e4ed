"""Live updates for browsers: server-sent events, coalesced per experiment.

A browser's page opens one event stream (``GET /api/events``) for one experiment, or for
"the newest" (the page at ``/``). It gets, as SSE events with JSON data:

``snapshot``     what to draw first: ``{"experiment", "trials", "total", "platforms", "experiments"}``
                 (``experiment`` is null while there is none; ``trials`` the first
                 ``SNAPSHOT_ROWS`` rows in submission order, of ``total``); first, and again
                 whenever the stream moves to a newer experiment;
``update``       ``{"experiment", "trials", "removed", "changed", "stale"}``: the overview, how
                 many trials changed since the last push, and, when at most ``INLINE_ROWS`` did,
                 their rows and the ids of those removed; past that ``stale`` is true and the
                 rows are left out (the browser asks for the rows it shows); at most one per
                 batch interval;
``experiments``  the experiment list changed (one was created, stopped, finished);
``platforms``    the adapters' status changed.

Why batch: a dispatcher applies events in bursts (1,000 trials submitted at once, 1,000
ending a second at 100,000 trials), and a browser redrawing once per event would fall
behind. The hub takes the model's changes every ``interval`` seconds and sends each
experiment's as one frame, encoded once for all of its streams. A frame's size is bounded
whatever the experiment's size or rate of change: the overview, and at most ``INLINE_ROWS``
rows; never every row. The table is virtualised in the browser and asks
``/api/experiments/<id>/trials?offset=…`` for the rows it shows (``static/virtual.js``).
A stream whose browser does not keep up (``limit`` frames queued) is closed; the browser
reconnects and starts again from a snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

import nats.errors
import orjson

from services.webui.model import Model

log = logging.getLogger(__name__)

#: Sent first: how long a browser waits before reconnecting a dropped stream (ms).
RETRY = b"retry: 2000\n\n"
#: A comment line that keeps idle connections open through proxies.
KEEPALIVE = b": keep-alive\n\n"
#: Rows a snapshot carries (the top of the table as it first shows, without a round trip).
SNAPSHOT_ROWS = 100
#: At most this many changed rows go in an update; past it, a hint that the rows are stale.
INLINE_ROWS = 50


def frame(event: str, data: Any) -> bytes:
    """One server-sent event; NaN and infinities become null (they are not JSON)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class Closable(Protocol):
    def close(self) -> None: ...


class Stream:
    """One browser's event stream: frames waiting to be written (None ends it)."""

    def __init__(self, experiment_id: str | None, limit: int) -> None:
        #: None: the stream follows the newest experiment (the page at ``/``).
        self.experiment_id = experiment_id
        #: The experiment the browser shows now.
        self.showing = experiment_id
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.limit = limit
        self.closed = False

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        if self.queue.qsize() >= self.limit:
            log.info("a browser does not keep up with its event stream; closing it (it reconnects)")
            self.close()
            return
        self.queue.put_nowait(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


class Hub:
    """The open streams, and the loop that pushes the model's changes to them."""

    def __init__(self, model: Model, interval: float, limit: int = 500) -> None:
        self.model = model
        self.interval = interval
        self.limit = limit
        self.platforms: list[dict[str, Any]] = []
        self.streams: set[Stream] = set()
        #: Anything else that must end when the service stops (curve streams), by its close.
        self.closers: set[Closable] = set()
        self._cleanups: set[asyncio.Task] = set()

    def snapshot(self, experiment_id: str | None) -> bytes:
        top = self.model.window(experiment_id, "sequence", False, None, 0, SNAPSHOT_ROWS) if experiment_id else None
        return frame(
            "snapshot",
            {
                "experiment": self.model.overview(experiment_id) if experiment_id else None,
                "trials": top["trials"] if top else [],
                "total": top["total"] if top else 0,
                "platforms": self.platforms,
                "experiments": self.model.summaries(),
            },
        )

    def open(self, experiment_id: str | None) -> Stream:
        """A stream that starts with a snapshot; the caller must :meth:`close_stream` it."""
        stream = Stream(experiment_id, self.limit)
        stream.showing = experiment_id or self.model.newest()
        stream.send(RETRY + self.snapshot(stream.showing))
        self.streams.add(stream)
        return stream

    def close_stream(self, stream: Stream) -> None:
        stream.close()
        self.streams.discard(stream)

    def set_platforms(self, statuses: list[dict[str, Any]]) -> None:
        self.platforms = statuses
        if self.streams:
            data = frame("platforms", statuses)
            for stream in self.streams:
                stream.send(data)

    def flush(self) -> None:
        """Send every stream what changed in its experiment since the last flush."""
        changes = self.model.take_changes()
        if not self.streams:
            return
        moved: set[Stream] = set()
        if changes.experiments_list:
            listing = frame("experiments", self.model.summaries())
            newest = self.model.newest()
            for stream in self.streams:
                stream.send(listing)
                if stream.experiment_id is None and stream.showing != newest:
                    stream.showing = newest
                    stream.send(self.snapshot(newest))
                    moved.add(stream)
        for experiment_id in changes.touched():
            watching = [s for s in self.streams if s.showing == experiment_id and s not in moved]
            if not watching:
                continue
            changed = changes.trials.get(experiment_id, set())
            stale = len(changed) > INLINE_ROWS
            rows = [] if stale else self.model.rows(experiment_id, changed)
            present = {row["id"] for row in rows}
            data = frame(
                "update",
                {
                    "experiment": self.model.overview(experiment_id),
                    "trials": rows,
                    "removed": [] if stale else sorted(changed - present),
                    "changed": len(changed),
                    "stale": stale,
                },
            )
            for stream in watching:
                stream.send(data)
        for stream in [s for s in self.streams if s.closed]:
            self.streams.discard(stream)

    async def run(self) -> None:
        """Flush every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.flush()
            except Exception:  # a bug in a view must not end live updates for everyone
                log.exception("could not push changes to browsers")

    def cleanup(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a stream's cleanup outside its request, which is being cancelled (a browser left)."""
        task = asyncio.create_task(coroutine)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    def close(self) -> None:
        """End every stream, so that the HTTP server, which waits for open responses, can stop."""
        for stream in list(self.streams):
            self.close_stream(stream)
        for closer in list(self.closers):
            closer.close()

    async def cleaned_up(self) -> None:
        """Await the cleanups of the streams that ended (call once the HTTP server stopped)."""
        while self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)


#: Seconds without news before a stream sends a keep-alive comment.
KEEPALIVE_SECONDS = 15.0


class Follower(Closable, Protocol):
    """What a live stream follows (a trial's curve, an experiment's log lines): started, then ready
    whenever it has news, which ``take`` hands over."""

    ready: asyncio.Event
    closed: bool

    async def start(self) -> Any: ...

    def take(self) -> Any: ...

    async def stop(self) -> None: ...


async def followed(
    hub: Hub,
    follower: Follower,
    stream: str,
    first: Callable[[Any], bytes | None],
    each: Callable[[Any], bytes],
    coalesce: float,
) -> AsyncIterator[bytes]:
    """The server-sent frames of a follower of the JetStream ``stream``: ``first`` of what its start
    read (None: nothing), then ``each`` of what it takes, a burst coalesced over ``coalesce`` seconds,
    keep-alives meanwhile. The follower lives inside the response: a browser that leaves before the
    first frame leaves no consumer behind."""
    hub.closers.add(follower)
    try:
        yield RETRY
        try:
            opening = first(await follower.start())
        except (nats.errors.Error, TimeoutError) as exc:
            yield frame("problem", {"error": f"cannot read the {stream} stream right now ({exc}); retrying"})
            return
        if opening is not None:
            yield opening
        while not follower.closed:
            try:
                await asyncio.wait_for(follower.ready.wait(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield KEEPALIVE
                continue
            if follower.closed:
                return
            yield each(follower.take())
            await asyncio.sleep(coalesce)
    finally:
        hub.closers.discard(follower)
        hub.cleanup(follower.stop())  # not awaited here: this request may be being cancelled
