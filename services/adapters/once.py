"""One launch per trial attempt at a time: a second call for an attempt whose launch is under way
waits for that launch's answer instead of starting it again.

An adapter whose launch writes the attempt's folder and then creates a job under a name of its
own (a Framework, an OpenPAI job) would otherwise let two concurrent calls for one attempt race:
the one that did not make the folder creates the job, and the other takes its own job's name for
a stranger's. Each key's launch is one task; cancelling a caller cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class OncePerKey(Generic[T]):
    """Runs ``make()`` for a key unless a run for that key is under way; every caller gets its answer."""

    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Task[T]] = {}

    async def run(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> T:
        task = self._running.get(key)
        if task is None:
            task = self._running[key] = asyncio.ensure_future(make())
            task.add_done_callback(lambda _done: self._running.pop(key, None))
        return await task
