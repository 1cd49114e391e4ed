"""Watch streams: ``?watch=true`` answers 200 with one JSON event per line, chunked, until it ends.

As in the apiserver:

- no ``resourceVersion`` (or ``"0"``) starts with an ADDED event per current object, then live
  events; a ``resourceVersion`` replays every matching write after it, then goes live;
- a ``resourceVersion`` older than the history gives a single ``ERROR`` event carrying a 410
  Expired ``Status`` (the official client's ``Watch`` retries once, then raises ``ApiException(410)``);
- with a label selector, an object that starts matching arrives as ADDED and one that stops as DELETED;
- ``allowWatchBookmarks`` adds a BOOKMARK (the current resourceVersion, no object body) whenever
  the stream has been idle for ``BOOKMARK_INTERVAL``;
- ``timeoutSeconds`` ends the stream cleanly, as does ``drop_watches()`` (a client should resume).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from . import status
from .resources import Resource
from .status import ApiError
from .store import Event, Obj, Store

BOOKMARK_INTERVAL = 1.0


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return (json.dumps({"type": kind, "object": obj}, separators=(",", ":")) + "\n").encode()


def _visible(event: Event, resource: Resource, match: Callable[[Obj], bool]) -> str | None:
    """The event type this watcher sees, or None: a selector turns entering and leaving into ADDED and DELETED."""
    if event.resource != resource.plural:
        return None
    now = match(event.obj)
    if event.type != "MODIFIED" or event.previous is None:
        return event.type if now else None
    before = match(event.previous)
    if now and before:
        return "MODIFIED"
    return "ADDED" if now else "DELETED" if before else None


def _since(value: str | None) -> int | None:
    if value in (None, "", "0"):
        return None
    try:
        return int(value)  # type: ignore[arg-type]
    except ValueError:
        raise status.bad_request(f"invalid resource version: {value!r}") from None


def watch(
    store: Store,
    resource: Resource,
    match: Callable[[Obj], bool],
    resource_version: str | None,
    timeout: float | None,
    bookmarks: bool,
) -> StreamingResponse:
    """The streaming response for one watch (``match`` already includes the namespace)."""
    try:
        backlog, queue = store.subscribe(_since(resource_version))
    except ApiError as exc:
        if exc.code != 410:
            raise
        return StreamingResponse(iter([_line("ERROR", exc.status())]), media_type="application/json")
    return StreamingResponse(
        _events(store, resource, match, backlog, queue, timeout, bookmarks), media_type="application/json"
    )


async def _events(
    store: Store,
    resource: Resource,
    match: Callable[[Obj], bool],
    backlog: list[Event],
    queue: asyncio.Queue[Event | None],
    timeout: float | None,
    bookmarks: bool,
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout else None
    try:
        for event in backlog:
            kind = _visible(event, resource, match)
            if kind is not None:
                yield _line(kind, event.obj)
        while True:
            wait = BOOKMARK_INTERVAL if bookmarks else None
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                wait = min(wait, remaining) if wait is not None else remaining
            try:
                event = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                if bookmarks and (deadline is None or loop.time() < deadline):
                    marker = {
                        "kind": resource.kind,
                        "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(store.rv)},
                    }
                    yield _line("BOOKMARK", marker)
                continue
            if event is None:
                return  # drop_watches()
            kind = _visible(event, resource, match)
            if kind is not None:
                yield _line(kind, event.obj)
    finally:
        store.unsubscribe(queue)
