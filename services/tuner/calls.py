"""Calls into a user's class, on the threads NNI's dispatcher would make them from.

NNI runs a tuner in a dispatcher process of its own, which handles the manager's commands one at a time
on a worker thread. With NNI v1's ``multiThread: true`` the manager splits a request for N trials into N
requests for one, and NNI 2.x's dispatcher hands every command to a thread pool as it arrives: the tuner is
then called from several threads at once and must guard its own state, and a ``generate_parameters`` that
waits (for a result, say) holds up nothing else. :class:`Calls` is that worker, or that pool, per class:

=====================  ==================================================  =========================================
                       without ``multiThread`` (``threads=1``)             with ``multiThread`` (``threads`` > 1)
=====================  ==================================================  =========================================
``generate_*``         the class's one worker thread (``tuner-class-N``),  the proposal pool (``tuner-propose-N``,
                       in turn with every other call                       up to ``threads`` at once)
every other call       the same worker thread, one at a time               the command pool (``tuner-class-N``, up
                                                                           to ``threads`` at once): never queued
                                                                           behind a proposal
=====================  ==================================================  =========================================

The caller blocks until its calls are done (the driver calls from its own threads, off its event loop, so a
slow tuner holds up its own experiment only). The threads are daemons (:mod:`services.tuner.threads`): a call
that never returns keeps no process from exiting.

Whatever the user's code raises becomes :class:`~services.tuner.protocol.ClassFailed`, carrying the
traceback from the user's frame down (file and line of the user's code): the experiment stops with it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from services.tuner.protocol import ClassFailed
from services.tuner.threads import DaemonPool

T = TypeVar("T")
#: One call of a batch: ``(fn, args, kwargs)``.
Call = tuple[Callable[..., T], tuple[Any, ...], dict[str, Any]]

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
        self._pool = DaemonPool(self.threads, "tuner-class")
        #: ``multiThread``: the generate calls' own threads, so that one waiting never holds up the other calls.
        self._proposals = DaemonPool(self.threads, "tuner-propose") if self.concurrent else self._pool

    @property
    def concurrent(self) -> bool:
        """Whether several calls may run at once (``multiThread``)."""
        return self.threads > 1

    def one(self, method: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the worker; :class:`ClassFailed` if it raises."""
        return self._pool.submit(self._run, method, fn, args, kwargs).result()

    def many(self, method: str, calls: list[Call[T]]) -> list[T]:
        """Each ``(fn, args, kwargs)`` at once on the pool (in turn on a single worker); their results in order.
        Every call runs to its end; then the first failure, in the calls' order, is raised."""
        return self._all(self._pool, method, calls)

    def proposals(self, method: str, calls: list[Call[T]]) -> list[T]:
        """As :meth:`many`, for the calls that generate trials: with ``multiThread`` on threads of their own."""
        return self._all(self._proposals, method, calls)

    def _all(self, pool: DaemonPool, method: str, calls: list[Call[T]]) -> list[T]:
        futures: list[Future[T]] = [pool.submit(self._run, method, fn, a, kw) for fn, a, kw in calls]
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
        """No more calls; a call in progress (user code cannot be interrupted) finishes on its own, and its thread
        ends with it."""
        self._pool.shutdown()
        self._proposals.shutdown()

    def alive(self) -> int:
        """The class's threads still running (after :meth:`close`: those still in a call of the user's)."""
        return self._pool.alive() + (self._proposals.alive() if self._proposals is not self._pool else 0)
