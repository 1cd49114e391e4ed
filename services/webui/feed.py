"""What feeds the model: watches of the ``experiments`` and ``trials`` buckets, and the
adapters' platform status.

A watch (an ordered consumer under the hood) delivers every key's current value, then
each change as it is written, and resumes by itself after a reconnect. :meth:`Feed.start`
returns once both buckets' current values are in the model, so the first page served
after a start is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import nats.errors

from contracts import ContractError, ExperimentState, TrialState, streams
from services.common import kvwatch, platforms
from services.common.bus import Bus
from services.common.tasks import cancel_and_wait, first_failure
from services.webui.model import Model

log = logging.getLogger(__name__)


def reason(exc: ContractError) -> str:
    """Why an entry did not decode, without the entry's values (a config holds secrets)."""
    cause = exc.__cause__
    if cause is not None and hasattr(cause, "errors"):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in cause.errors(include_input=False))
    return type(exc).__name__


class Feed:
    """Keeps a :class:`Model` current from the two buckets until :meth:`stop`."""

    def __init__(self, bus: Bus, model: Model) -> None:
        self.bus = bus
        self.model = model
        self._tasks: list[asyncio.Task] = []

    async def start(self, timeout: float = 30.0) -> None:
        """Watch both buckets; return once their current values are applied."""
        loaded = []
        for bucket, model, put, delete in (
            (
                streams.EXPERIMENTS_BUCKET.bucket,
                ExperimentState,
                self.model.put_experiment,
                self.model.delete_experiment,
            ),
            (streams.TRIALS_BUCKET.bucket, TrialState, self.model.put_trial, self.model.delete_trial),
        ):
            done = asyncio.Event()
            loaded.append(done)
            self._tasks.append(asyncio.create_task(self._apply(self.bus, bucket, model, put, delete, done)))
        async with asyncio.timeout(timeout):
            for done in loaded:
                await done.wait()
        log.info(
            "watching %d experiments and %d trials",
            len(self.model.experiments),
            sum(map(len, self.model.trials_of.values())),
        )

    @staticmethod
    async def _apply(
        bus: Bus,
        bucket: str,
        model: type[ExperimentState] | type[TrialState],
        put: Callable[[Any], None],
        delete: Callable[[str], None],
        loaded: asyncio.Event,
    ) -> None:
        async with contextlib.aclosing(kvwatch.watch(bus, bucket, deletes=True)) as entries:
            async for entry in entries:
                if entry is None:  # the end of the current values; changes follow
                    loaded.set()
                    continue
                if entry.deleted:
                    delete(entry.key)
                    continue
                try:
                    put(model.decode(entry.value))
                except ContractError as exc:
                    log.warning("skipping unreadable %s entry %s: %s", bucket, entry.key, reason(exc))
        loaded.set()

    def failed(self) -> BaseException | None:
        """A watch that died (it should not: watches resume after reconnects)."""
        return first_failure(self._tasks)

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)


async def poll_platforms(bus: Bus, publish: Callable[[list[dict[str, Any]]], None], interval: float) -> None:
    """Read every adapter replica's status each ``interval`` seconds; ``publish`` what changed.

    The entries' ``time`` moves at every refresh; a push happens only when something else did.
    """
    last: list[dict[str, Any]] | None = None
    while True:
        try:
            current = [status.to_json() for status in await platforms.statuses(bus)]
        except (nats.errors.Error, TimeoutError, OSError) as exc:  # the bus is down: try again later
            log.debug("could not read platform status: %s", exc)
        else:
            unchanged = last is not None and [_timeless(s) for s in current] == [_timeless(s) for s in last]
            if not unchanged:
                publish(current)
            last = current
        await asyncio.sleep(interval)


def _timeless(status: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in status.items() if key != "time"}
