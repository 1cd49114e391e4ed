"""The contract suite's hands on a platform: :class:`Harness` starts adapters the way the
service does, waits for what they report, and cleans up every trial they launched."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from contracts import TrialRequest
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome
from services.adapters.errors import TransientError
from services.common.bus import Bus


async def outcome_at_a_notify(
    adapter: PlatformAdapter, handle: TrialHandle, named: list[TrialHandle | None], timeout: float
) -> TrialOutcome:
    """For a platform whose adapter also calls ``notify`` while a trial runs (a state change, a
    reconnect): the outcome ``poll`` gives at one of the ``notify`` calls naming the trial (``named``
    is the list the adapter's listener appends to), within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        while handle not in named:
            assert time.monotonic() < deadline, "the adapter never called notify() for the ended trial"
            await asyncio.sleep(0.01)
        named.clear()
        if (outcome := await adapter.poll(handle)) is not None:
            return outcome


class Harness:
    """Starts adapters the way the service does, and cleans up every trial they launched.

    ``make_adapter``, ``starts`` and ``request`` are the contract's, for one workspace;
    ``slack`` the seconds a trial of duration 0 may take to start and end."""

    def __init__(
        self,
        bus: Bus,
        make_adapter: Callable[[], PlatformAdapter],
        starts: Callable[[str], int],
        request: Callable[[float, int], TrialRequest],
        slack: float,
    ) -> None:
        self.bus, self.slack = bus, slack
        self._make_adapter, self._starts, self._request = make_adapter, starts, request
        self.running: list[PlatformAdapter] = []

    def request(self, duration: float = 0.0, exit_code: int = 0) -> TrialRequest:
        return self._request(duration, exit_code)

    def starts(self, request: TrialRequest) -> int:
        return self._starts(request.trial_id)

    async def adapter(self) -> PlatformAdapter:
        adapter = self._make_adapter()
        await adapter.start(self.bus)
        self.running.append(adapter)
        return adapter

    async def stop(self, adapter: PlatformAdapter) -> None:
        self.running.remove(adapter)
        await adapter.stop()

    async def outcome(self, handle: TrialHandle, timeout: float | None = None, adapter: PlatformAdapter | None = None):
        adapter = adapter or self.running[-1]
        deadline = time.monotonic() + (timeout or self.slack)
        while (outcome := await adapter.poll(handle)) is None:
            assert time.monotonic() < deadline, f"{handle.trial_id} did not end in time"
            await asyncio.sleep(0.02)
        return outcome

    async def until_started(self, handle: TrialHandle) -> None:
        """Wait until the platform has really started the trial."""
        deadline = time.monotonic() + self.slack
        while self._starts(handle.trial_id) == 0:
            assert time.monotonic() < deadline, f"{handle.trial_id} did not start in time"
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        """Stop every adapter; then one more adopts what still runs and cancels it."""
        while self.running:
            await self.stop(self.running[-1])
        cleaner = await self.adapter()
        try:
            for handle in await cleaner.adopt():
                deadline = time.monotonic() + self.slack
                while True:
                    try:
                        await cleaner.cancel(handle)
                        break
                    except TransientError as exc:  # e.g. still starting: the service retries too
                        assert time.monotonic() < deadline, f"{handle.trial_id} cannot be canceled: {exc}"
                        await asyncio.sleep(exc.delay)
                await self.outcome(handle, adapter=cleaner)
        finally:
            await self.stop(cleaner)
