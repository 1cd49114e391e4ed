"""Calls into a user's class, on the threads NNI's dispatcher would make them from.

NNI runs a tuner in a dispatcher process of its own, which handles the manager's commands one at a time
on a worker thread. With NNI v1's ``multiThread: true`` the manager splits a request for N trials into N
requests for one, and the dispatcher handles every command on a thread pool: the tuner is then called
from several threads at once and must guard its own state. :class:`Calls` is that worker, or that pool
(``threads`` > 1): the caller blocks until its calls are done, and the driver makes its calls off its
event loop, so a slow tuner holds up its own experiment only.

Whatever the user's code raises becomes :class:`~services.tuner.protocol.ClassFailed`, carrying the
traceback from the user's frame down (file and line of the user's code): the experiment stops with it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from services.tuner.protocol import ClassFailed

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Most threads a ``multiThread`` class is called from (NNI's pool has one per CPU; here one per trial
#: wanted at once, so that a request for ``trialConcurrency`` trials is generated all at once).
MAX_THREADS = 32


def failure(owner: str, method: str, exc: BaseException, *, skip: int = 1) -> ClassFailed:
    """``exc``, raised in ``owner``'s ``method``, as the experiment's reason to stop: the traceback without the
    ``skip`` outermost frames (ours, that called in)."""
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    details = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
    return ClassFailed(f"{owner} failed in {method}", details)


class Calls:
    """One class's calls: on one worker thread (``threads=1``, NNI's default) or on a pool (``multiThread``)."""

    def __init__(self, owner: str, threads: int = 1) -> None:
        self.owner = owner  # "tuner class my_tuner.MyTuner": how messages name the class
        self.threads = max(1, min(threads, MAX_THREADS))
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="tuner-class")

    @property
    def concurrent(self) -> bool:
        """Whether several calls may run at once (``multiThread``)."""
        return self.threads > 1

    def one(self, method: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the worker; :class:`ClassFailed` if it raises."""
        return self._pool.submit(self._run, method, fn, args, kwargs).result()

    def many(self, method: str, calls: list[tuple[Callable[..., T], tuple[Any, ...], dict[str, Any]]]) -> list[T]:
        """Each ``(fn, args, kwargs)`` at once on the pool (in turn on a single worker); their results in order.
        Every call runs to its end; then the first failure, in the calls' order, is raised."""
        futures: list[Future[T]] = [self._pool.submit(self._run, method, fn, a, kw) for fn, a, kw in calls]
        wait(futures)
        return [future.result() for future in futures]

    def _run(self, method: str, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise failure(self.owner, method, exc) from None

    def hook(self, instance: Any, name: str) -> None:
        """NNI's ``_on_exit`` / ``_on_error``, when the class has it; what it raises is only logged (the experiment
        is over by then)."""
        if callable(method := getattr(instance, name, None)):
            try:
                self.one(name, method)
            except ClassFailed as exc:
                log.warning("%s", exc)

    def close(self) -> None:
        """No more calls; a call in progress (user code cannot be interrupted) finishes on its own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
