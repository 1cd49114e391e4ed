"""Frameworks across an adapter restart and after their end: adoption, release, logs.

Nothing about an attempt lives only in memory: its Framework is labelled with this replica,
the experiment, the trial and the attempt, and its folder on the storage says whether its end
was published. ``adopt`` lists the Frameworks of the frameworkcontroller experiments on the
bus by label and tracks the ones whose end was never published, so their trials run on while
the adapter restarts; ``release`` marks a folder reported once the service has published the
attempt's end, and deletes its Framework. The storage keeps the folders, so ``past`` and
``log_tail`` serve the logs of any attempt, also of trials that ended before this run of the
adapter.

:class:`Restarts` is a part of
:class:`~services.adapters.frameworkcontroller.adapter.FrameworkcontrollerAdapter`: it hands the
attempts it adopts to ``track`` (the watcher's), and removes them from the :class:`~.jobs.Jobs`
it is given once released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from contracts.base import utcnow
from contracts.frameworkcontroller import AzureStorage, FrameworkcontrollerConfig
from services.adapters import sharefs, trialdir
from services.adapters.base import TrialHandle
from services.adapters.errors import PermanentError, TransientError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import Kubernetes
from services.adapters.frameworkcontroller.experiments import Experiments
from services.adapters.frameworkcontroller.jobs import Job, Jobs
from services.adapters.frameworkcontroller.storage import StorageSecrets

log = logging.getLogger(__name__)


class Restarts:
    """Adoption, release and past attempts' logs (the module's docstring); ``kube``: the cluster
    client (made on first use), ``track``: tracks an adopted attempt, ``root``: an experiment's
    storage (the launcher's), ``selector``: this replica's label selector."""

    def __init__(
        self,
        kube: Callable[[], Kubernetes],
        tracked: Jobs,
        track: Callable[[TrialHandle, FrameworkcontrollerConfig], Job],
        root: Callable[[FrameworkcontrollerConfig], sharefs.Share],
        secrets: StorageSecrets,
        experiments: Experiments,
        selector: str,
    ) -> None:
        self.kube, self.tracked, self.track, self.root = kube, tracked, track, root
        self.secrets, self.experiments, self.selector = secrets, experiments, selector

    async def adopt(self) -> list[TrialHandle]:
        """This replica's Frameworks of the frameworkcontroller experiments on the bus."""
        handles = []
        for state, service in await self.experiments.all():
            try:
                root = self.root(service)
                selector = f"{self.selector},{frameworks.LABEL}/experiment={state.id}"
                items, _ = await self.kube().list(service.namespace, selector)
            except (TransientError, PermanentError) as exc:
                log.warning("cannot adopt the Frameworks of experiment %s: %s", state.id, exc)
                continue
            if isinstance(service.storage, AzureStorage):
                self.secrets.adopted(state.id, service.namespace)
            for obj in items:
                meta = obj["metadata"]
                trial_id, attempt = meta["labels"]["trialbus.io/trial"], int(meta["labels"]["trialbus.io/attempt"])
                folder = sharefs.trial_share(root, state.id, trial_id, attempt).local
                if trialdir.is_reported(folder):
                    continue
                started = frameworks.parse_time((obj.get("status") or {}).get("startTime")) or utcnow()
                handle = TrialHandle(
                    state.id, trial_id, attempt, ref=f"{service.namespace}/{meta['name']}#{folder}", start_time=started
                )
                job = self.track(handle, service)
                job.framework, job.queue = obj, frameworks.queue_of(obj)
                handles.append(handle)
        return handles

    async def release(self, handle: TrialHandle) -> None:
        job = self.tracked.pop((handle.trial_id, handle.attempt))
        folder = job.folder if job else handle.ref.split("#", 1)[1]
        sharefs.mark_reported(folder)
        if job is not None:
            try:  # its end is published and its files are on the storage: the object goes
                await self.kube().delete(job.namespace, job.name)
            except (TransientError, PermanentError) as exc:
                log.warning("cannot delete Framework %s/%s: %s", job.namespace, job.name, exc)

    async def past(self, experiment_id: str, trial_id: str, attempt: int | None = None) -> TrialHandle | None:
        """An attempt (the newest by default) of a finished trial whose folder the storage keeps (its logs)."""
        for state, service in await self.experiments.all():
            if state.id == experiment_id:
                with contextlib.suppress(PermanentError):
                    found = sharefs.newest_attempt(self.root(service).local, experiment_id, trial_id, attempt)
                    if found:
                        return TrialHandle(experiment_id, trial_id, found[0], ref=f"{service.namespace}/-#{found[1]}")
        return None

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        return await asyncio.to_thread(sharefs.log_tail, handle.ref.split("#", 1)[1], max_bytes)
