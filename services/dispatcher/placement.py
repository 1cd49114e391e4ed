"""Which platform of a hybrid experiment (``trainingService`` as a list) runs a trial.

NNI's hybrid mode lets one experiment use several platforms at once. Here the choice is the
dispatcher's, made when a trial takes one of the experiment's ``trialConcurrency`` slots, from
what the adapters publish in the ``platforms`` bucket (:class:`~contracts.PlatformStatus`,
refreshed every few seconds by each replica) and from the dispatcher's own count of the trials
it has sent to each adapter and not seen end (exact at once, where the statuses lag):

- **Up or not.** A platform is up while one replica of its adapter that is not drained
  (``trialbus platform drain``) published a status in the last ``stale_after`` seconds and,
  for ``remote``, one of the experiment's machines is not reported unreachable (a machine the
  adapter has not connected to yet counts as usable: the trial's launch connects it), for
  ``openpai``/``frameworkcontroller``, a cluster answers.
- **Room.** A platform whose replicas hold requests waiting for capacity (GPUs) has none.
  Otherwise its room is its capacity less the trials sent there and not ended: ``local``'s
  ``maxTrials`` per replica (for GPU trials, at most its GPUs × ``maxTrialNumberPerGpu`` ÷
  ``trialGpuNumber``); ``remote``'s CPUs of the experiment's usable machines (GPU trials: their
  GPUs likewise); ``openpai`` and ``frameworkcontroller`` queue on the cluster, so they always
  have room while up.
- **Choice.** Among the platforms with room, the one running the fewest of this experiment's
  trials (spreading evenly), then the one listed first after the last choice (round robin). With
  no platform up and with room, the trial stays queued in the dispatcher, its message saying
  why, and goes out as soon as one has room: a platform that is down or full holds no trial back.

Every call costs O(platforms × replicas) (and the experiment's machines, for remote): nothing
here grows with the number of trials.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Collection
from datetime import timedelta

from contracts import PlatformStatus
from contracts.base import utcnow
from contracts.experiment import ExperimentConfig, LocalConfig, OpenpaiConfig, RemoteConfig
from contracts.nni import TrainingService
from services.dispatcher.shares import Capacity


class Placement:
    """The platforms' statuses, the trials sent to each, and the choice for the next trial."""

    def __init__(self, stale_after: float) -> None:
        self.stale_after = stale_after
        #: ``<adapter>.<replica>`` → its latest status
        self.statuses: dict[str, PlatformStatus] = {}
        #: adapter → trials sent there and not ended (every experiment's)
        self.sent: Counter[str] = Counter()
        #: experiment → adapter → its trials sent there and not ended
        self.sent_of: dict[str, Counter[str]] = defaultdict(Counter)
        #: experiment → index (in its list) of the platform chosen last
        self._last: dict[str, int] = {}

    # ------------------------------------------------------------------ inputs

    def status(self, key: str, status: PlatformStatus | None) -> None:
        """A replica's new status, or None when its entry was deleted (it stopped)."""
        if status is None:
            self.statuses.pop(key, None)
        else:
            self.statuses[key] = status

    def occupy(self, experiment_id: str, adapter: str) -> None:
        self.sent[adapter] += 1
        self.sent_of[experiment_id][adapter] += 1

    def release(self, experiment_id: str, adapter: str) -> None:
        if self.sent_of[experiment_id][adapter] > 0:
            self.sent[adapter] -= 1
            self.sent_of[experiment_id][adapter] -= 1

    # ------------------------------------------------------------------ decisions

    def choose(self, experiment_id: str, config: ExperimentConfig, skip: Collection[str] = ()) -> str | None:
        """The adapter the experiment's next trial goes to; None while no platform is up with room
        (``skip``: adapters not to choose, those whose teams' shares refused the trial just now)."""
        services = config.training_services
        start = self._last.get(experiment_id, -1) + 1
        best: tuple[int, int] | None = None
        chosen = 0
        for offset in range(len(services)):
            i = (start + offset) % len(services)
            if services[i].adapter in skip:
                continue
            free = self.room(services[i], config)
            if free is None or free <= 0:
                continue
            rank = (self.sent_of[experiment_id][services[i].adapter], offset)
            if best is None or rank < best:
                best, chosen = rank, i
        if best is None:
            return None
        self._last[experiment_id] = chosen
        return services[chosen].adapter

    def capacity(self, pool: str) -> Capacity:
        """What a pool (:meth:`pool_of`) of the adapter's live replicas has to share between teams
        (:mod:`.shares`). A whole adapter: its GPUs (a remote adapter's: those of the machines it
        reaches) and trial slots (unbounded where a replica sets no ``maxTrials``, as clusters do).
        ``<adapter>/<name>``: the GPUs of its machines in pool ``name`` (remote) and of its clusters'
        virtual cluster ``name`` (OpenPAI: the largest a cluster says, as one cluster is meant), its
        trials unbounded. Nothing bounded while no replica is live: its trials go out and wait on the
        stream as before. O(replicas × machines)."""
        adapter, _, name = pool.partition("/")
        replicas = self._live(adapter)
        if not replicas:
            return Capacity()
        if name:
            machines = {m.name: len(m.gpus) for r in replicas for m in r.machines if m.up and name in m.pools}
            clusters = [c.virtual_clusters[name] for r in replicas for c in r.clusters if name in c.virtual_clusters]
            return Capacity(float(sum(machines.values()) + max(clusters, default=0.0)))
        trials = math.inf if any(r.max_trials is None for r in replicas) else sum(r.max_trials or 0 for r in replicas)
        machines = {m.name: len(m.gpus) for r in replicas for m in r.machines if m.up}
        return Capacity(float(sum(len(r.gpus) for r in replicas) + sum(machines.values())), float(trials))

    @staticmethod
    def pool_of(config: ExperimentConfig, adapter: str) -> str:
        """The pool whose capacity a trial of ``config`` on ``adapter`` takes (:mod:`.shares`): the
        remote ``trainingService.pool``'s, an OpenPAI job's virtual cluster's, else the adapter's."""
        service = config.service_for(adapter)
        if isinstance(service, RemoteConfig) and service.pool:
            return f"{adapter}/{service.pool}"
        if isinstance(service, OpenpaiConfig):
            defaults = (service.openpai_config or {}).get("defaults")
            job = defaults.get("virtualCluster") if isinstance(defaults, dict) else None
            return f"{adapter}/{job or service.virtual_cluster or 'default'}"
        return adapter

    @staticmethod
    def gpus_of(config: ExperimentConfig, adapter: str) -> float:
        """The GPUs one trial of ``config`` holds on ``adapter``: ``trialGpuNumber``, shared by up to
        ``maxTrialNumberPerGpu`` trials on local."""
        service = config.service_for(adapter)
        if service is None:
            return 0.0
        gpus = config.gpus_for(service) or 0
        if gpus and isinstance(service, LocalConfig):
            return gpus / service.max_trial_number_per_gpu
        return float(gpus)

    def why_waiting(self, config: ExperimentConfig) -> str:
        """Why :meth:`choose` found no platform: each platform's reason, for the trial's message."""
        reasons = []
        for service in config.training_services:
            free = self.room(service, config)
            reasons.append(f"{service.platform} {self.down_reason(service, config) if free is None else 'is full'}")
        return "waiting for a platform with room: " + "; ".join(reasons)

    def up(self, service: TrainingService, config: ExperimentConfig) -> bool:
        return self.room(service, config) is not None

    def room(self, service: TrainingService, config: ExperimentConfig) -> float | None:
        """Trials ``service`` can take now (``inf``: the cluster queues them); None when it is down."""
        replicas = self._live(service.adapter)
        if not replicas:
            return None
        gpus = config.gpus_for(service) or 0
        if isinstance(service, RemoteConfig):
            machines = self._machines(service, replicas)
            usable = [m for m in machines.values() if m is None or m.up]
            if not usable:
                return None
            if any(r.waiting for r in replicas):
                return 0
            if gpus:
                per_gpu = {m.address: m.max_trial_number_per_gpu for m in service.machine_list}
                capacity = sum(
                    len(m.gpus) * per_gpu[name] // gpus if m else 1 for name, m in machines.items() if m is None or m.up
                )
            else:
                capacity = sum(m.cpus if m else 1 for m in usable)
            return capacity - self.sent[service.adapter]
        if any(r.clusters for r in replicas) and all(c.error for r in replicas for c in r.clusters):
            return None
        if any(r.waiting for r in replicas):
            return 0
        if any(r.max_trials is None for r in replicas):
            return math.inf
        capacity = sum(r.max_trials or 0 for r in replicas)
        if gpus and isinstance(service, LocalConfig):
            capacity = min(capacity, sum(len(r.gpus) for r in replicas) * service.max_trial_number_per_gpu // gpus)
        return capacity - self.sent[service.adapter]

    def down_reason(self, service: TrainingService, config: ExperimentConfig) -> str:
        replicas = self._live(service.adapter)
        if not replicas and self._live(service.adapter, drained=True):
            return "is drained (every replica of its adapter: trialbus platform undrain takes one back)"
        if not replicas:
            return f"is down (no {service.adapter} adapter replica published its status in {self.stale_after:g}s)"
        if isinstance(service, RemoteConfig):
            return "is down (no machine reachable)"
        return "is down (its cluster does not answer)"

    # ------------------------------------------------------------------ internals

    def _live(self, adapter: str, drained: bool = False) -> list[PlatformStatus]:
        """The adapter's replicas that published lately: those taking trials, or with ``drained``, the drained."""
        now = utcnow()
        oldest, forgotten = now - timedelta(seconds=self.stale_after), now - timedelta(seconds=10 * self.stale_after)
        for key in [k for k, s in self.statuses.items() if s.time < forgotten]:  # a replica gone for good
            del self.statuses[key]
        return [
            s for s in self.statuses.values() if s.adapter == adapter and s.time >= oldest and s.draining == drained
        ]

    @staticmethod
    def _machines(service: RemoteConfig, replicas: list[PlatformStatus]) -> dict:
        """The experiment's machines by address: their status, or None where no replica reports it."""
        reported = {m.name: m for r in replicas for m in r.machines}
        return {m.address: reported.get(m.address) for m in service.machine_list}
