"""The trials the tuner service reads: only its own experiments', never a copy of every trial.

* **Changes** (:func:`follow`): one subscription to the ``trials`` bucket from now on (no current values:
  a replica does not read every trial there is when it starts). Each change's experiment id is read with orjson,
  and a change of an experiment no driver of this replica drives is dropped there: nothing decoded, nothing kept.
* **What a driver starts from** (:func:`of_experiment`): its experiment's trials, read from the dispatcher a page
  at a time (``trial.list``, the same operation the Python client pages through), when the driver starts.

A driver is registered before it reads its pages, so a trial that changes while it reads is in a page, in the
changes that follow, or both (the driver takes each trial's first end and never goes back from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from contracts import TrialState
from contracts.base import FROM_BUS, peek
from services.common import kvwatch
from services.common.api import ApiError, call
from services.common.bus import Bus

log = logging.getLogger(__name__)

#: Trials per page a driver reads when it starts (the dispatcher's largest page).
PAGE = 5000
#: Seconds between two tries of a page the dispatcher did not answer.
RETRY_AFTER = 1.0
_PREFIX = "$KV.trials."


def experiment_of(raw: bytes) -> str | None:
    """The experiment id of a ``trials`` entry, without building a :class:`TrialState`; None if unreadable."""
    return peek(raw, "experimentId")


async def follow(bus: Bus, apply: Callable[[bytes], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """Call ``apply`` with each new value of the ``trials`` bucket, in order, from now on (deletes left out).
    Returns the function that stops following (and removes the consumer)."""

    async def on_message(msg: Msg) -> None:
        if msg.data:  # a delete or purge marker has none
            await apply(msg.data)

    sub = await bus.js.subscribe(
        _PREFIX + ">",
        stream="KV_trials",
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
        inactive_threshold=kvwatch.INACTIVE,
    )

    async def stop() -> None:
        with contextlib.suppress(Exception):  # the connection may be gone already
            await sub.unsubscribe()
            await bus.js.delete_consumer("KV_trials", sub._consumer)

    return stop


async def of_experiment(bus: Bus, experiment_id: str, timeout: float) -> AsyncIterator[TrialState]:
    """The experiment's trials in submission order, a page at a time; a page the dispatcher does not answer is
    asked again after :data:`RETRY_AFTER` (none when the experiment is gone: 404)."""
    cursor: str | None = None
    while True:
        body: dict[str, Any] = {"experimentId": experiment_id, "limit": PAGE, "sort": "sequence"}
        if cursor is not None:
            body["cursor"] = cursor
        try:
            page = await call(bus.nc, "trial.list", body, timeout)
        except ApiError as exc:
            if exc.status == 404:
                return
            log.warning(
                "could not read the trials of experiment %s (%s); trying again in %.0fs",
                experiment_id,
                exc.message,
                RETRY_AFTER,
            )
            await asyncio.sleep(RETRY_AFTER)
            continue
        for trial in page["trials"]:
            yield TrialState.model_validate(trial, context=FROM_BUS)
        if (cursor := page.get("nextCursor")) is None:
            return


class Ended:
    """The sequence ids of an experiment's trials that a driver is done with: a bit each (12.5 KB for 100,000
    trials), where a set of their ids would take some 70 bytes a trial."""

    def __init__(self) -> None:
        self._bits = bytearray()
        self.count = 0

    def add(self, sequence_id: int) -> None:
        byte, bit = divmod(sequence_id, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))  # doubling
        if not self._bits[byte] >> bit & 1:
            self._bits[byte] |= 1 << bit
            self.count += 1

    def __contains__(self, sequence_id: int) -> bool:
        byte, bit = divmod(sequence_id, 8)
        return byte < len(self._bits) and bool(self._bits[byte] >> bit & 1)

    @property
    def nbytes(self) -> int:
        return len(self._bits)
