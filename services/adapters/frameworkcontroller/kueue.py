"""Kueue in front of the trials' pods: which LocalQueue, whether it exists, whether Kueue still
holds a trial.

FrameworkController is none of Kueue's built-in integrations and its Framework has no
``suspend``, so the trials go through Kueue's plain-Pod integration (the ``pod`` framework, which
the cluster's admin enables in Kueue's Configuration for the namespaces Trialbus uses). The pod
templates carry Kueue's labels (:func:`~.frameworks.kueue_metadata`); Kueue's webhook puts the
scheduling gate ``kueue.x-k8s.io/admission`` on each pod as FrameworkController creates it, and
removes it once the pods' workload is admitted by the ClusterQueue behind the LocalQueue.
"Suspended" here means gated: the pods exist, Pending, and no node runs them. A trial whose pods
are gated stays WAITING ("queued in Kueue LocalQueue …"); its preparing timeout counts from
admission.

The LocalQueue: the experiment's ``trainingService.kueue.localQueue``, else the adapter's
``TRIALBUS_KUEUE_LOCAL_QUEUE`` with ``{team}`` replaced; neither: no Kueue, and the Framework is
as it always was. One asked for must exist: Kueue would leave the pods gated for ever (their
workload inadmissible), so the experiment is refused at creation and a trial fails at launch
(permanent) saying which LocalQueue is missing where, or that Kueue is not installed.

:class:`Kueue` is a part of
:class:`~services.adapters.frameworkcontroller.adapter.FrameworkcontrollerAdapter`, given the
adapter's settings and its cluster client.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.adapters.errors import PermanentError
from services.adapters.frameworkcontroller import frameworks
from services.adapters.frameworkcontroller.client import KUEUE_GROUP, Kubernetes
from services.adapters.frameworkcontroller.jobs import Job
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings

#: Seconds a LocalQueue found is trusted before the next launch asks again.
FOUND_FOR = 60.0


class Kueue:
    """The LocalQueue of each trial and what Kueue does with its pods (the module's docstring);
    ``kube``: the cluster client (made on first use)."""

    def __init__(self, settings: FrameworkcontrollerSettings, kube: Callable[[], Kubernetes]) -> None:
        self.settings, self.kube = settings, kube
        self._found: dict[tuple[str, str], float] = {}  # (namespace, LocalQueue) → when it was found

    def queue_for(self, service: FrameworkcontrollerConfig, team: str | None, experiment_id: str) -> str | None:
        """The LocalQueue of an experiment's trials; None: no Kueue."""
        if service.kueue is not None:
            return service.kueue.local_queue
        template = self.settings.kueue_local_queue
        if template is None or "{team}" not in template:
            return template
        if not team:
            raise PermanentError(
                f"this adapter queues trials in Kueue's LocalQueue {template} of the experiment's team, but "
                f"experiment {experiment_id} has no team: name a LocalQueue in trainingService.kueue.localQueue"
            )
        return template.replace("{team}", team.replace("_", "-"))

    async def ensure(self, namespace: str, queue: str) -> None:
        """PermanentError unless Kueue is installed and ``namespace`` has the LocalQueue ``queue``."""
        if time.monotonic() - self._found.get((namespace, queue), -FOUND_FOR) < FOUND_FOR:
            return
        problem = await self.problem(namespace, queue)
        if problem is not None:
            raise PermanentError(problem)
        self._found[(namespace, queue)] = time.monotonic()

    async def problem(self, namespace: str, queue: str | None) -> str | None:
        """Why the trials cannot queue in ``queue`` (None: only whether Kueue is installed)."""
        kube = self.kube()
        version = await kube.kueue_version()
        if version is None:
            return (
                f"Kueue LocalQueue {queue or self.settings.kueue_local_queue} is asked for, but {kube.server} does "
                f"not serve {KUEUE_GROUP}: Kueue is not installed in this cluster"
            )
        if queue is not None and await kube.local_queue(namespace, queue, version) is None:
            return (
                f"Kueue LocalQueue {queue} does not exist in namespace {namespace} (see kubectl get localqueues "
                f"-n {namespace}): ask the cluster's admin for it, or name another in trainingService.kueue.localQueue"
            )
        return None

    async def problems(self, service: FrameworkcontrollerConfig) -> list[str]:
        """What stops an experiment's trials from queueing in Kueue (its LocalQueue, when a team's
        is not known yet: only whether Kueue is installed); [] without Kueue."""
        queue = service.kueue.local_queue if service.kueue is not None else self.settings.kueue_local_queue
        if queue is None:
            return []
        problem = await self.problem(service.namespace, None if "{team}" in queue else queue)
        return [problem] if problem else []

    async def queued(self, job: Job) -> str | None:
        """Why Kueue still holds the attempt (its pods gated, or not made yet); None once admitted."""
        if job.queue is None or job.admitted or job.outcome is not None or job.deleted:
            return None
        running = job.framework is not None and frameworks.phase(frameworks.state_of(job.framework)) != "waiting"
        if not running:
            pods = await self.kube().pods(job.namespace, job.name)
            gated = not pods or any(
                gate.get("name") == frameworks.KUEUE_GATE
                for pod in pods
                for gate in (pod.get("spec") or {}).get("schedulingGates") or []
            )
            if gated:
                return f"queued in Kueue LocalQueue {job.queue} (pods gated until admitted)"
        job.admitted, job.since = True, time.monotonic()  # the preparing timeout counts from here
        return None
