"""Threads for tuner calls that never hold up the service's exit.

A user's tuner may block for ever: a ``generate_parameters`` waiting for a result that never comes, an ``_on_exit``
that hangs. Python joins every ``ThreadPoolExecutor`` thread (asyncio's default executor's too) when it exits, so
one such call on them would keep the tuner service from stopping, whatever its shutdown bound. The threads here are
daemons: a call that never returns costs its thread until the process exits, and nothing else.

:class:`DaemonPool` is a ``ThreadPoolExecutor`` of daemon threads (started as calls need them, up to ``workers``;
:meth:`DaemonPool.shutdown` cancels the calls not started and ends idle threads; a busy thread ends when its call
returns); :func:`spawn` runs one call on a thread of its own.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["DaemonPool", "spawn"]

T = TypeVar("T")

_numbers = itertools.count(1)  # thread names: unique in the process, as ThreadPoolExecutor's are


def _settle(future: Future[T], fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # the caller's to judge, through the future
        future.set_exception(exc)
    else:
        future.set_result(result)


def spawn(name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
    """``fn(*args, **kwargs)`` on a new daemon thread: it runs even while every pool's threads are busy."""
    future: Future[T] = Future()
    threading.Thread(
        target=_settle, args=(future, fn, args, kwargs), name=f"{name}-{next(_numbers)}", daemon=True
    ).start()
    return future


class DaemonPool(Executor):
    """Up to ``workers`` daemon threads taking calls in submission order."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = max(1, workers)
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple, dict] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by a thread that finished a call and waits for the next
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: no calls after shutdown")
            future: Future[T] = Future()
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.workers:
                thread = threading.Thread(target=self._work, name=f"{self.name}-{next(_numbers)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            _settle(*item)
            del item  # the call's arguments and result go now, not with the next call
            self._idle.release()

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """No more calls; the calls not started are cancelled (with ``cancel_futures``). With ``wait``, until the
        calls in progress returned (unbounded: a blocked user's call blocks it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def alive(self) -> int:
        """Threads still running (busy in a call, or not yet ended after :meth:`shutdown`)."""
        return sum(thread.is_alive() for thread in self._threads)
