"""Cancel requests to the adapters: asking the replica that owns a trial to stop it, and when
it was last asked, so the sweep asks again a trial whose owner has not ended it yet.

A cancel is a request on ``control.<adapter>.cancel``; no answer (no replica up, a timeout)
is only logged: the sweep asks again after :data:`~services.dispatcher.sweep.CANCEL_RETRY`
seconds. A stop asks many owners at once, in the background, :data:`AT_ONCE` at a time.
Memory is one float per trial being canceled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

from contracts import subjects
from contracts.messages import CancelRequest
from contracts.state import TrialState, TrialStatus
from services.common.bus import Bus

log = logging.getLogger(__name__)

#: Requests and KV writes a stop sends at once.
AT_ONCE = 64


class CancelRequests:
    """The cancels asked of the adapters (the module's docstring); ``timeout``: seconds to wait for an answer."""

    def __init__(self, bus: Bus, timeout: float) -> None:
        self._bus = bus
        self._timeout = timeout
        #: trial → loop time of the last cancel request sent to its adapter
        self._sent: dict[str, float] = {}
        self._asking: set[asyncio.Task] = set()  # a stop's cancel requests, on their way

    async def ask(self, trial: TrialState) -> None:
        """Ask the owning replica to stop the trial; no answer is retried by the sweep."""
        self._sent[trial.id] = asyncio.get_running_loop().time()
        request = CancelRequest(
            experiment_id=trial.experiment_id,
            trial_id=trial.id,
            status=trial.cancel_status or TrialStatus.USER_CANCELED,
            message=trial.message,
        )
        try:
            await self._bus.nc.request(
                subjects.control(trial.platform, "cancel"), request.encode(), timeout=self._timeout
            )
        except Exception:
            log.info("no %s replica answered the cancel of %s yet; will retry", trial.platform, trial.id)

    def ask_all(self, trials: list[TrialState]) -> None:
        """:meth:`ask` for many trials, in the background, :data:`AT_ONCE` at a time."""
        task = asyncio.create_task(at_most(AT_ONCE, (self.ask(t) for t in trials)))
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    def sent_at(self, trial_id: str) -> float:
        """Loop time of the trial's last cancel request (0.0: never asked)."""
        return self._sent.get(trial_id, 0.0)

    def forget(self, trial_id: str) -> None:
        """The trial's attempt ended: nothing more to ask."""
        self._sent.pop(trial_id, None)


async def at_most(limit: int, coros: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Await ``coros``, at most ``limit`` at a time (their errors raised once all are done)."""
    gate = asyncio.Semaphore(limit)

    async def one(coro: Coroutine[Any, Any, Any]) -> None:
        async with gate:
            await coro

    errors = [r for r in await asyncio.gather(*(one(c) for c in coros), return_exceptions=True) if r is not None]
    if errors:
        raise errors[0]
