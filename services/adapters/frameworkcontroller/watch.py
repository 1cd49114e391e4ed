"""Watching Frameworks: the watch per namespace that keeps every tracked one current, a
trial's end read from it, cancel.

Status comes from a **watch** per namespace (resumed from its resourceVersion, relisted every
``relist_interval`` seconds and after a 410, so a missed event heals), not from polling each
trial: ``AttemptCreationPending/Requested/Preparing`` wait (the trial says so after
``queue_note_after`` seconds and fails after the preparing timeout: an image that never
pulls), ``AttemptRunning`` runs, ``Completed`` ends SUCCEEDED or FAILED by its completion
status (:func:`~.frameworks.outcome_of`, with the reporting task's keeper state); while Kueue
holds its pods (:mod:`.kueue`) a Framework waits without the note or the timeout. Each event
about a tracked Framework calls ``notify`` with its trial, so its end is polled at once. A
Framework deleted by someone else ends its trial SYS_CANCELED. Cancel patches
``executionType: Stop``.

:class:`Watcher` is a part of
:class:`~services.adapters.frameworkcontroller.adapter.FrameworkcontrollerAdapter`: it tracks
the attempts launched or adopted in the :class:`~.jobs.Jobs` it is given (:meth:`Watcher.track`,
which starts the namespace's watch), owns the watches and their last error, and stops them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from contracts import TrialStatus
from contracts.base import utcnow
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.adapters import sharefs
from services.adapters.base import TrialHandle, TrialOutcome
from services.adapters.errors import PermanentError, Stale, TransientError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import Gone, Kubernetes
from services.adapters.frameworkcontroller.jobs import Job, Jobs
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class Watcher:
    """The namespaces' watches and what they say of each trial (the module's docstring);
    ``kube``: the cluster client (made on first use), ``notify``: the adapter's."""

    def __init__(
        self,
        settings: FrameworkcontrollerSettings,
        kube: Callable[[], Kubernetes],
        tracked: Jobs,
        notify: Callable[[TrialHandle], None],
    ) -> None:
        self.settings, self.kube, self.tracked, self.notify = settings, kube, tracked, notify
        self.selector = frameworks.replica_selector(settings.replica)
        self.error: str | None = None  # why the last watch or list failed
        self._watches: dict[str, asyncio.Task] = {}

    def track(self, handle: TrialHandle, service: FrameworkcontrollerConfig) -> Job:
        """Track the attempt ``handle`` names, and watch its namespace."""
        job = self.tracked.add(Job.of(handle, service, self.settings.preparing_timeout))
        if job.namespace not in self._watches or self._watches[job.namespace].done():
            self._watches[job.namespace] = asyncio.create_task(self._watch(job.namespace))
        return job

    async def stop(self) -> None:
        await cancel_and_wait(self._watches.values())

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        job = self.tracked.find(handle)
        if job.outcome is not None:
            return job.outcome
        if job.deleted:
            job.outcome = TrialOutcome(
                TrialStatus.SYS_CANCELED,
                None,
                f"Framework {job.namespace}/{job.name} was deleted outside Trialbus",
                None,
                utcnow(),
            )
            return job.outcome
        state = frameworks.state_of(job.framework)
        if frameworks.phase(state) == "ended" and job.framework is not None:  # ended: a state read from it
            keeper = await asyncio.to_thread(sharefs.keeper_state, job.folder, job.report)
            job.outcome = frameworks.outcome_of(job.framework, keeper, job.canceled)
            return job.outcome
        waited = time.monotonic() - job.since
        queued = job.queue is not None and not job.admitted  # Kueue holds it: WAITING, no timeout (kueue.py)
        if frameworks.phase(state) == "waiting" and not job.canceled and not queued:
            if state == "AttemptPreparing" and waited > job.preparing_timeout:
                await self.kube().stop(job.namespace, job.name)
                job.outcome = TrialOutcome(
                    TrialStatus.FAILED,
                    None,
                    f"Framework {job.namespace}/{job.name} stayed "
                    f"AttemptPreparing for {waited:.0f}s (an image that cannot be pulled, or no "
                    "room for its pods?): stopped",
                    "trial",
                    utcnow(),
                )
                return job.outcome
            if waited > self.settings.queue_note_after:
                raise Stale(
                    f"Framework {job.namespace}/{job.name} is {state} (waiting for its pods)",
                    delay=self.settings.poll_interval,
                )
        if self.error is not None:
            raise Stale(
                f"cannot watch Framework {job.namespace}/{job.name}: {self.error}", delay=self.settings.poll_interval
            )
        return None

    async def cancel(self, handle: TrialHandle) -> None:
        job = self.tracked.find(handle)
        if job.outcome is None and not job.deleted:
            job.canceled = True
            await self.kube().stop(job.namespace, job.name)

    async def _watch(self, namespace: str) -> None:
        """Keep every tracked Framework of ``namespace`` current: list, then watch from the
        list's resourceVersion; again after a 410, a dropped stream or ``relist_interval``."""
        version, listed = "", 0.0
        loop = asyncio.get_running_loop()
        while any(j.namespace == namespace for j in self.tracked):
            try:
                if not version or time.monotonic() - listed > self.settings.relist_interval:
                    items, version = await self.kube().list(namespace, self.selector)
                    listed = time.monotonic()
                    self._sync(namespace, items)
                version = await asyncio.to_thread(self._stream, namespace, version, loop)
                self.error = None
            except Gone:
                version = ""
            except (TransientError, PermanentError) as exc:
                if str(exc) != self.error:
                    log.warning("cannot watch Frameworks in %s: %s", namespace, exc)
                self.error = str(exc)
                await asyncio.sleep(2.0)

    def _stream(self, namespace: str, version: str, loop: asyncio.AbstractEventLoop) -> str:
        """One watch request (in a thread): each event handed to the loop; the last version."""
        for event in self.kube().watch(namespace, self.selector, version, self.settings.watch_timeout):
            obj = event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if event.get("type") != "BOOKMARK":
                loop.call_soon_threadsafe(self._event, namespace, event.get("type"), obj)
        return version

    def _sync(self, namespace: str, items: list[dict]) -> None:
        """A full list: every tracked Framework updated; the ones missing were deleted."""
        seen = {}
        for obj in items:
            seen[obj["metadata"]["name"]] = obj
            self._event(namespace, "MODIFIED", obj)
        for name, job in self.tracked.in_namespace(namespace):
            if name not in seen and job.framework is not None:
                self._event(namespace, "DELETED", job.framework)

    def _event(self, namespace: str, kind: str | None, obj: dict) -> None:
        job = self.tracked.named(namespace, (obj.get("metadata") or {}).get("name", ""))
        if job is None or job.outcome is not None:
            return
        if kind == "DELETED":
            job.deleted = True
        else:
            if frameworks.state_of(obj) != frameworks.state_of(job.framework) or job.framework is None:
                job.since = time.monotonic()
            job.framework = obj
        self.notify(job.handle)
