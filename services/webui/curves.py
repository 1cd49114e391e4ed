"""A trial's metric records from the METRICS stream: its intermediate curve and its final.

The curve a browser shows is read with an ordered consumer on
``metrics.<experiment>.<trial>`` from the stream's first message: the history arrives
first, then every new record as the gateway publishes it, each record once (the stream
deduplicates by ``<trial>:<type>:<sequence>[:<attempt>]``; a resend after the dedupe window is
dropped here). An ordered consumer needs no durable state and recovers from gaps by itself.

A retried trial has records of every attempt on its subject, and each attempt numbers its
intermediate results from 0 again: a record is one attempt's (``attempt`` in each point), and
is told apart by ``(attempt, type, sequence)``, so a retry's records are never taken for
resends of the first attempt's. The browser draws one line per attempt (``static/detail.js``).

A browser asks for at most ``points`` points per attempt (about twice its chart's width): the
stream sends the records as they come while they fit; once an attempt reported more, each
frame is a ``curve`` event that replaces what was drawn with the records cut down to fit,
extremes kept (:mod:`services.webui.downsample`). Either way a frame holds O(points) records,
and the follower keeps O(points) of them (and the keys of all, to drop resends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DeliverPolicy

from contracts import ContractError, MetricRecord, streams, subjects
from contracts.metrics import records_of
from services.common.bus import Bus
from services.webui.downsample import Curve
from services.webui.model import default_metric

log = logging.getLogger(__name__)

#: Points per attempt a curve is cut down to when the browser does not say (``points``).
DEFAULT_POINTS = 1000
#: The fewest and the most points per attempt a browser may ask for.
POINTS_RANGE = (16, 10_000)


def point(record: MetricRecord) -> dict[str, Any] | None:
    """One record as the browser plots it; None when its value is not JSON."""
    try:
        value = record.decoded()
    except ValueError:
        return None
    return {
        "type": record.type.value,
        "attempt": record.attempt,
        "sequence": record.sequence,
        "value": value,
        "default": default_metric(value),
        "timestamp": record.timestamp.isoformat(),
    }


class Records:
    """Decoded records, each once, waiting to be sent."""

    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] = []
        #: ``(attempt, type, sequence)`` of every record kept: one attempt's, once.
        self._seen: set[tuple[int, str, int]] = set()

    def add(self, data: bytes, subject: str) -> bool:
        """Keep the message's records (one, or a keeper's batch) but those unreadable or seen before;
        whether any was kept."""
        try:
            records = records_of(data)
        except ContractError:
            log.warning("skipping an unreadable metric record on %s", subject)
            return False
        kept = False
        for record in records:
            key = (record.attempt, record.type.value, record.sequence)
            if key in self._seen or (plotted := point(record)) is None:
                continue
            self._seen.add(key)
            self._pending.append(plotted)
            kept = True
        return kept

    def take(self) -> list[dict[str, Any]]:
        taken, self._pending = self._pending, []
        return taken


class CurveFollower:
    """One trial's records for one browser: history, then live; :meth:`take` what is new."""

    def __init__(self, bus: Bus, experiment_id: str, trial_id: str, points: int = DEFAULT_POINTS) -> None:
        self.bus = bus
        self.subject = subjects.metrics(experiment_id, trial_id)
        #: Set when records wait in :meth:`take`, or when the follower is closed.
        self.ready = asyncio.Event()
        self.closed = False
        self._records = Records()
        self._curve = Curve(points)
        self._cut = False
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.bus.js.subscribe(
            self.subject,
            stream=streams.METRICS.name,
            cb=self._on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )

    async def _on_message(self, msg: Msg) -> None:
        if self._records.add(msg.data, msg.subject):
            self.ready.set()

    def take(self) -> tuple[str, list[dict[str, Any]]]:
        """``("metrics", the records that came since the last call, oldest first)`` while every
        record fits in ``points`` per attempt; past that ``("curve", all of them cut down)``, which
        replaces what the browser drew. O(records new + points)."""
        self.ready.clear()
        new = self._records.take()
        for record in new:
            self._curve.add(record)
        self._cut = self._cut or self._curve.cut
        return ("curve", self._curve.points()) if self._cut else ("metrics", new)

    def close(self) -> None:
        """Ask the browser's stream to end (the service stops)."""
        self.closed = True
        self.ready.set()

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None


async def history(
    bus: Bus, experiment_id: str, trial_id: str, timeout: float = 5.0, points: int | None = None
) -> list[dict[str, Any]]:
    """Every record of the trial now in the stream, each once, oldest first; with ``points``, cut
    down to that many intermediate results per attempt, extremes kept, then the finals."""
    subject = subjects.metrics(experiment_id, trial_id)
    info = await bus.js.stream_info(streams.stream_name(streams.METRICS), subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    records = Records()
    if not count:
        return []
    sub = await bus.js.subscribe(
        subject, stream=streams.METRICS.name, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        for _ in range(count):
            records.add((await sub.next_msg(timeout=timeout)).data, subject)
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    if points is None:
        return records.take()
    curve = Curve(points)
    for record in records.take():
        curve.add(record)
    return curve.points()
