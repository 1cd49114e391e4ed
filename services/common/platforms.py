"""Reading the ``platforms`` bucket: every live adapter replica's :class:`~contracts.PlatformStatus`.

Each replica writes its own entry (``AdapterService``); an adapter reads its peers' to
decide whether a trial it can never run here could run elsewhere, and the dispatcher
answers ``GET /api/v1/platforms`` from them. Adapters whose platforms come with each
experiment (SSH machines, OpenPAI clusters) also read the ``experiments`` bucket
(:func:`experiments`) to find their trials again after a restart, and follow it
(:func:`watch_experiments`) to know which of their machines running experiments need.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta

from contracts import ContractError, ExperimentState, PlatformStatus, streams
from contracts.base import utcnow
from services.common import kvwatch
from services.common.bus import Bus

log = logging.getLogger(__name__)


async def statuses(bus: Bus, adapter: str | None = None) -> list[PlatformStatus]:
    """Fresh statuses (younger than the bucket's ttl), of one adapter or of all, by key."""
    oldest = utcnow() - timedelta(seconds=streams.PLATFORMS_TTL)
    found = []
    entries = await kvwatch.current(bus, streams.PLATFORMS_BUCKET.bucket, f"{adapter}.>" if adapter else ">")
    for entry in sorted(entries, key=lambda e: e.key):
        if not entry.value:
            continue
        try:
            status = PlatformStatus.decode(entry.value)
        except ContractError as exc:
            log.warning("ignoring the status under %s: %s", entry.key, exc)
            continue
        if status.time >= oldest:
            found.append(status)
    return found


async def experiments(bus: Bus) -> list[ExperimentState]:
    """Every experiment the dispatcher keeps (unreadable entries skipped, with a warning)."""
    found = []
    for entry in sorted(await kvwatch.current(bus, streams.EXPERIMENTS_BUCKET.bucket), key=lambda e: e.key):
        try:
            found.append(ExperimentState.decode(entry.value))
        except ContractError as exc:
            log.warning("skipping unreadable experiment %s: %s", entry.key, exc)
    return found


async def watch_experiments(bus: Bus, apply: Callable[[ExperimentState], None]) -> None:
    """Call ``apply`` with every experiment in the bucket, then with each change, until cancelled
    (a broken watch is opened again; unreadable entries are skipped)."""
    while True:
        try:
            async with contextlib.aclosing(kvwatch.watch(bus, streams.EXPERIMENTS_BUCKET.bucket)) as entries:
                async for entry in entries:
                    if entry is None or not entry.value:
                        continue
                    try:
                        apply(ExperimentState.decode(entry.value))
                    except ContractError as exc:
                        log.warning("skipping unreadable experiment %s: %s", entry.key, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("watching the experiments failed (%s); watching again", exc)
            await asyncio.sleep(1.0)
