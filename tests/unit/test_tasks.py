"""Stopping background tasks: a cancellation that a task loses (as Python 3.11's
``asyncio.wait_for`` can lose one) does not keep it running, and a stop always returns."""

from __future__ import annotations

import asyncio
import gc

from services.common import tasks


async def test_a_loop_that_swallows_its_first_cancellation_is_cancelled_again_and_ends() -> None:
    # Given a polling loop whose first cancellation is lost, as wait_for loses one that
    # arrives just as its inner future completes (python/cpython#86296)
    swallowed = []

    async def poll() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if not swallowed:
                    swallowed.append(True)
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    continue
                raise

    task = asyncio.create_task(poll())
    await asyncio.sleep(0.05)

    # When it is stopped
    async with asyncio.timeout(5 * tasks.RECANCEL):
        await tasks.cancel_and_wait([task])

    # Then it ended, after a second cancellation
    assert swallowed == [True] and task.cancelled()


async def test_ended_and_failed_tasks_are_taken_without_a_never_retrieved_warning(caplog) -> None:
    async def fail() -> None:
        raise ValueError("boom")

    failed, done = asyncio.create_task(fail()), asyncio.create_task(asyncio.sleep(0))
    running = asyncio.create_task(asyncio.sleep(60))
    await asyncio.sleep(0.01)

    await tasks.cancel_and_wait([failed, done, running])

    assert running.cancelled() and failed.done()
    del failed
    gc.collect()
    assert "never retrieved" not in caplog.text
