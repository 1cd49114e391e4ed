"""An adapter replica's :class:`~contracts.PlatformStatus` in the ``platforms`` bucket
(``GET /api/v1/platforms``): written every ``status_interval`` seconds and soon after a change,
deleted when the replica stops (else it expires with the bucket's ttl)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

import nats.errors
from nats.js.kv import KeyValue

from contracts import PlatformStatus, streams, subjects
from contracts.base import utcnow
from services.common.bus import Bus

log = logging.getLogger(__name__)

#: Seconds between two status writes at least, however often capacity changes.
STATUS_MIN_GAP = 0.25


class StatusPublisher:
    """Publishes one replica's status; ``fields`` gives the rest of it (trials running and
    waiting, draining, the platform's own fields), read at each write."""

    def __init__(self, adapter: str, replica: str, interval: float, fields: Callable[[], dict]) -> None:
        self._adapter, self._replica, self._interval, self._fields = adapter, replica, interval, fields
        self._key = subjects.platform_key(adapter, replica)
        self._due = asyncio.Event()
        self._platforms: KeyValue | None = None  # the platforms KV bucket, once started

    def due(self) -> None:
        """The status changed: write it soon."""
        self._due.set()

    async def start(self, bus: Bus) -> None:
        self._platforms = await bus.kv(streams.PLATFORMS_BUCKET.bucket)

    @property
    def _bucket(self) -> KeyValue:
        if self._platforms is None:
            raise RuntimeError("the status publisher is not started")
        return self._platforms

    async def run(self) -> None:
        """Write the status every ``interval`` and shortly after a change (at most every
        ``STATUS_MIN_GAP`` seconds)."""
        host = socket.gethostname()
        while True:
            self._due.clear()
            try:
                status = PlatformStatus(
                    adapter=self._adapter, replica=self._replica, host=host, time=utcnow(), **self._fields()
                )
                await self._bucket.put(self._key, status.encode())
            except (nats.errors.Error, OSError) as exc:  # the broker restarts: next round
                log.debug("cannot publish the platform status: %s", exc)
            except Exception:  # a bug in describe() must not stop the adapter
                log.exception("cannot build the platform status")
            await asyncio.sleep(STATUS_MIN_GAP)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self._interval - STATUS_MIN_GAP)):
                    await self._due.wait()

    async def delete(self) -> None:
        """The replica stops: its status goes."""
        with contextlib.suppress(nats.errors.Error, OSError):  # else it expires with the bucket's ttl
            await self._bucket.delete(self._key)
