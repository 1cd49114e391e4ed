"""One attempt on Kubernetes, as the frameworkcontroller adapter keeps it: the :class:`Job`
record (its Framework, its folder on the storage, what the watch last saw of it) and the
:class:`Jobs` this replica tracks, by ``(trial id, attempt)`` and by the Framework's
``(namespace, name)``.

Shared by every part of :class:`~services.adapters.frameworkcontroller.adapter.FrameworkcontrollerAdapter`;
nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.adapters.base import TrialHandle, TrialOutcome, find_attempt

Key = tuple[str, int]  # (trial id, attempt)


@dataclass(eq=False)
class Job:
    handle: TrialHandle
    namespace: str
    name: str
    folder: str  # the attempt's folder on this host
    report: str  # ``<role>-0`` of the reporting role
    preparing_timeout: float
    framework: dict | None = None  # the latest object seen (None: not yet, or deleted)
    deleted: bool = False
    canceled: bool = False
    outcome: TrialOutcome | None = None
    since: float = 0.0  # when its state last changed (monotonic)
    queue: str | None = None  # the Kueue LocalQueue its pods wait in (None: no Kueue)
    admitted: bool = False  # Kueue admitted its pods (their scheduling gates are gone)

    @classmethod
    def of(cls, handle: TrialHandle, service: FrameworkcontrollerConfig, preparing_timeout: float) -> Job:
        """The attempt ``handle`` names (``ref``: ``<namespace>/<name>#<folder>``); ``preparing_timeout``:
        the adapter's, unless the experiment sets its own."""
        namespace, name = handle.ref.split("#", 1)[0].split("/", 1)
        return cls(
            handle,
            namespace,
            name,
            handle.ref.split("#", 1)[1],
            f"{service.reporting_role.name}-0",
            service.preparing_timeout or preparing_timeout,
            since=time.monotonic(),
        )


class Jobs:
    """The attempts this replica tracks: launched or adopted, until released."""

    def __init__(self) -> None:
        self._by_key: dict[Key, Job] = {}
        self._by_name: dict[tuple[str, str], Job] = {}  # (namespace, name) → job

    def get(self, key: Key) -> Job | None:
        return self._by_key.get(key)

    def find(self, handle: TrialHandle) -> Job:
        """The attempt's job; PermanentError when this replica does not track it."""
        return find_attempt(self._by_key, handle)

    def named(self, namespace: str, name: str) -> Job | None:
        """The job of the Framework ``namespace/name``."""
        return self._by_name.get((namespace, name))

    def add(self, job: Job) -> Job:
        self._by_key[(job.handle.trial_id, job.handle.attempt)] = self._by_name[(job.namespace, job.name)] = job
        return job

    def pop(self, key: Key) -> Job | None:
        job = self._by_key.pop(key, None)
        if job is not None:
            self._by_name.pop((job.namespace, job.name), None)
        return job

    def in_namespace(self, namespace: str) -> list[tuple[str, Job]]:
        """The Frameworks of ``namespace`` tracked, by name (a snapshot)."""
        return [(name, job) for (ns, name), job in list(self._by_name.items()) if ns == namespace]

    def __iter__(self) -> Iterator[Job]:
        """A snapshot: the loops await while iterating, and attempts come and go meanwhile."""
        return iter(list(self._by_key.values()))
