"""A service's background tasks: the first failure among them (what its ``failed()`` reports),
and stopping them.

Stopping is cancelling, then waiting. On Python 3.11 one cancellation is not always enough:
``asyncio.wait_for`` (nats-py awaits every request and JetStream call through it) drops a
cancellation that arrives just as its inner future completes (python/cpython#86296, fixed in
3.12), and the task carries on; a loop around such a call would then never end, and the
service's stop would wait for it forever. :func:`cancel_and_wait` cancels again until each
task has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

#: Seconds between cancellations of a task that is still running.
RECANCEL = 0.5


def first_failure(tasks: Iterable[asyncio.Future[Any]]) -> BaseException | None:
    """The exception of the first task that ended by one; None while all run, ended well or were cancelled."""
    for task in tasks:
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            return exc
    return None


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling again each
    :data:`RECANCEL` seconds one that lost its cancellation. Their results and exceptions are
    taken and dropped (report failures through :func:`first_failure` before stopping)."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # taken: asyncio would log it as never retrieved
