"""Who runs next on a platform that teams share: quotas, borrowing, fair share, priorities, and
which trials to preempt (docs/teams.md). The policy alone: no I/O, no clock, unit-tested with
properties (tests/unit/test_shares.py); :mod:`.slots` asks it before a trial takes capacity and
the sweep (:mod:`.sweep`) asks it which trials to preempt.

**Pools.** Capacity is shared per *pool*: a platform's whole capacity, or one part of it that
trials of an experiment can only run on (:meth:`~services.dispatcher.placement.Placement.pool_of`):
``local-gpu`` (an adapter's GPUs and trial slots, summed over its live replicas), ``remote`` or
``remote/<pool>`` (the GPUs of the SSH machines of the experiments that name that
``trainingService.pool``), ``openpai/<virtualCluster>`` (the GPUs OpenPAI says the virtual cluster
has). A pool with neither GPUs nor trial slots bounded (Kubernetes, whose cluster queues; an
OpenPAI cluster that does not say its GPUs) is not shared here: its trials go out at once. A team's
quota on a pool is ``platforms["<pool>"]``, else ``platforms["<adapter>"]``, else its ``quota``.
A trial holds ``trialGpuNumber ÷ maxTrialNumberPerGpu`` GPUs and one slot from its dispatch to its end.

**Order.** The experiments waiting for a pool are ranked, best first, by

1. *within quota*: whether the team's next trial stays within its quota (a team below its
   guarantee goes before any team borrowing);
2. the team's *dominant share* (the larger of its fractions of the pool's GPUs and slots in
   use) divided by its weight: weighted dominant resource fairness (Ghodsi et al., NSDI 2011);
3. the experiment's ``priority`` (higher first: this orders experiments of one team);
4. the experiment's own trials in the pool (fewer first: a team's experiments share evenly);
5. the experiment's start (earlier first), then its id.

An experiment's next trial takes capacity when it fits what is free and no experiment ranked
ahead of it also fits (so a trial too big for what is free now does not hold smaller ones back:
backfill; it is the quota and priority preemption below that bring a big trial its turn).

**Preemption** (:meth:`Shares.reclaim`), for the best-ranked experiment whose next trials do not
fit: a team *within its quota* takes back what other teams borrow (trials of teams running beyond
their own quota, while they still do: the lowest priority and the most recently started first),
and an experiment takes what experiments of its own team with a *lower priority* run. Trials being
preempted count as free already, so one shortage never preempts twice.

**Cost.** A decision looks at the pool's waiting experiments and the teams (O(E + T) with
E experiments waiting), never at the queued trials: an experiment waiting with 100,000 queued
trials costs what one with a single trial does. Preemption looks at the trials holding the
pool (bounded by its capacity). Holding and releasing a trial is O(1).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from contracts.teams import Quota, Team

#: A GPU share this close to a whole is the whole (fractions of GPUs add up in floats).
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Capacity:
    """A pool's GPUs (0: none) and trial slots (``inf``: no bound)."""

    gpus: float = 0.0
    trials: float = math.inf

    @property
    def bounded(self) -> bool:
        return self.gpus > 0 or self.trials < math.inf


@dataclass(slots=True)
class Holding:
    """A trial holding capacity in a pool: what it holds, and whose it is."""

    pool: str
    team: str
    experiment: str
    gpus: float
    priority: int
    #: When it took the capacity, in the order of holdings (larger: more recent).
    order: int = 0


@dataclass(slots=True)
class Demand:
    """An experiment waiting for a pool: its team, priority, start, and its next trials."""

    experiment: str
    team: str
    priority: int
    #: Its start time (seconds since the epoch): earlier goes first among equals.
    started: float
    #: GPUs its next trial holds.
    gpus: float
    #: Trials it could start now (its queue, up to its free ``trialConcurrency`` slots).
    want: int = 1


@dataclass(slots=True)
class Use:
    gpus: float = 0.0
    trials: int = 0


@dataclass(slots=True)
class Victim:
    """A trial to preempt, and why (said on its attempt)."""

    trial_id: str
    experiment: str
    why: str


@dataclass(slots=True)
class _Free:
    gpus: float
    trials: float

    def fits(self, gpus: float) -> bool:
        return gpus <= self.gpus + EPSILON and self.trials >= 1

    def take(self, gpus: float, trials: int = 1) -> None:
        self.gpus -= gpus
        self.trials -= trials


@dataclass
class Shares:
    """Teams' quotas, what each trial holds, and the experiments waiting (the module's docstring).

    ``wants(experiment)`` says how many trials an experiment could start now (its queue, up to its
    free ``trialConcurrency`` slots; 0 when stopped): a demand whose experiment wants none is dropped
    the next time it is looked at."""

    wants: Callable[[str], int] = lambda _experiment: 1
    teams: dict[str, Team] = field(default_factory=dict)
    #: trial → what it holds
    holdings: dict[str, Holding] = field(default_factory=dict)
    #: trials asked to stop for a preemption, not ended yet: their capacity counts as free
    preempting: set[str] = field(default_factory=set)
    #: pool → experiment → its demand
    demands: dict[str, dict[str, Demand]] = field(default_factory=lambda: defaultdict(dict))
    _used: dict[tuple[str, str], Use] = field(default_factory=lambda: defaultdict(Use))
    _total: dict[str, Use] = field(default_factory=lambda: defaultdict(Use))
    _of_experiment: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    _order: int = 0
    #: An experiment began waiting for a pool (was refused) since this was last cleared: what to
    #: preempt may have changed (the dispatcher looks at once rather than at its next sweep).
    arrived: bool = False

    # ------------------------------------------------------------------ holdings

    def hold(self, trial_id: str, holding: Holding) -> None:
        """The trial took capacity. O(1)."""
        if trial_id in self.holdings:
            self.release(trial_id)
        self._order += 1
        holding.order = self._order
        self.holdings[trial_id] = holding
        for use in (self._used[holding.pool, holding.team], self._total[holding.pool]):
            use.gpus += holding.gpus
            use.trials += 1
        self._of_experiment[holding.pool, holding.experiment] += 1

    def release(self, trial_id: str) -> Holding | None:
        """The trial ended (or went back to its queue): its capacity is free. O(1)."""
        holding = self.holdings.pop(trial_id, None)
        self.preempting.discard(trial_id)
        if holding is None:
            return None
        for use in (self._used[holding.pool, holding.team], self._total[holding.pool]):
            use.gpus = max(0.0, use.gpus - holding.gpus)
            use.trials -= 1
        self._of_experiment[holding.pool, holding.experiment] -= 1
        return holding

    def used(self, pool: str, team: str) -> Use:
        return self._used.get((pool, team)) or Use()

    def total(self, pool: str) -> Use:
        return self._total.get(pool) or Use()

    def withdraw(self, pool: str, experiment: str) -> None:
        """The experiment no longer waits for ``pool`` (its trial went, or waits, elsewhere). O(1)."""
        demands = self.demands.get(pool)
        if demands is not None:
            demands.pop(experiment, None)

    def done(self, experiment: str) -> None:
        """The experiment waits for nothing any more (its queue is empty, it stopped). O(pools)."""
        for demands in self.demands.values():
            demands.pop(experiment, None)

    # ------------------------------------------------------------------ admission

    def admit(self, pool: str, demand: Demand, capacity: Capacity) -> str | None:
        """Whether the experiment's next trial may take capacity on ``pool`` now: None when it may,
        else why it waits (for the trial's message). O(E + T)."""
        if not capacity.bounded or demand.gpus > capacity.gpus + EPSILON or capacity.trials < 1:
            self.demands[pool].pop(demand.experiment, None)
            return None  # nothing to share, or a trial no host here can ever run (its adapter says so)
        new = demand.experiment not in self.demands[pool]
        self.demands[pool][demand.experiment] = demand
        free = self._free(pool, capacity)
        key = self._keys(pool, capacity)
        mine = key(demand)
        ahead = [d for d in self._current(pool) if d.experiment != demand.experiment and key(d) < mine]
        if free.fits(demand.gpus) and not any(free.fits(d.gpus) for d in ahead):
            return None
        self.arrived = self.arrived or new  # it begins to wait: it may preempt at once
        return self.why(pool, demand, capacity, len(ahead))

    def ranked(self, pool: str, capacity: Capacity) -> list[Demand]:
        """The experiments waiting for ``pool``, best first."""
        return self._ranked(pool, capacity)

    def within_quota(self, pool: str, team: str, gpus: float, trials: int = 1, also: Use | None = None) -> bool:
        """Whether ``team`` holding ``gpus`` and ``trials`` more on ``pool`` (beyond what it holds, and
        ``also``) stays within its quota (a quota of some resource the trial uses, not exceeded on any)."""
        quota = self.quota(pool, team)
        held = self.used(pool, team)
        use = Use(held.gpus + (also.gpus if also else 0.0), held.trials + (also.trials if also else 0))
        governed = [(quota.gpus, use.gpus, gpus)] if gpus > 0 and quota.gpus is not None else []
        if quota.trials is not None:
            governed.append((float(quota.trials), float(use.trials), float(trials)))
        return bool(governed) and all(used + need <= limit + EPSILON for limit, used, need in governed)

    def quota(self, pool: str, team: str) -> Quota:
        config = self.teams.get(team)
        return config.quota_on(pool) if config else Quota()

    def weight(self, team: str) -> float:
        config = self.teams.get(team)
        return config.weight if config else 1.0

    # ------------------------------------------------------------------ preemption

    def reclaim(self, pool: str, capacity: Capacity, running: Callable[[str], bool]) -> list[Victim]:
        """The trials to preempt on ``pool`` now (the module's docstring): for each waiting experiment,
        best first, whose next trials do not fit what is free (trials being preempted count as free).
        Only ``running`` trials are preempted (one still starting is left to start). O(E × H log H) with
        H the trials holding the pool (at most its capacity)."""
        if not capacity.bounded:
            return []
        free = self._free(pool, capacity, counting_preempted=True)
        away: dict[str, Use] = defaultdict(Use)  # team → what it is losing already
        for trial_id in self.preempting:
            if (holding := self.holdings.get(trial_id)) is not None and holding.pool == pool:
                away[holding.team].gpus += holding.gpus
                away[holding.team].trials += 1
        victims: list[Victim] = []
        gains: dict[str, Use] = defaultdict(Use)  # team → what this look gives it (free, or preempted for it)
        for demand in self._ranked(pool, capacity):
            if demand.gpus > capacity.gpus + EPSILON:
                continue
            for _ in range(max(1, demand.want)):
                if not free.fits(demand.gpus):
                    chosen = self._victims(pool, demand, free, away, gains[demand.team], running)
                    if not chosen:
                        break
                    for trial_id, why in chosen:
                        holding = self.holdings[trial_id]
                        self.preempting.add(trial_id)
                        away[holding.team].gpus += holding.gpus
                        away[holding.team].trials += 1
                        free.take(-holding.gpus, -1)
                        victims.append(Victim(trial_id, holding.experiment, why))
                free.take(demand.gpus)
                gains[demand.team].gpus += demand.gpus
                gains[demand.team].trials += 1
        return victims

    def _victims(
        self,
        pool: str,
        demand: Demand,
        free: _Free,
        away: dict[str, Use],
        gained: Use,
        running: Callable[[str], bool],
    ) -> list[tuple[str, str]]:
        """Trials whose capacity makes ``demand``'s next trial fit, or none if no set of them does
        (``gained``: what its team gets already in this look, counted against its quota)."""
        reclaiming = self.within_quota(pool, demand.team, demand.gpus, also=gained)
        candidates = []
        for trial_id, holding in self.holdings.items():
            if holding.pool != pool or trial_id in self.preempting or not running(trial_id):
                continue
            if holding.team == demand.team:
                if holding.priority < demand.priority:
                    why = (
                        f"preempted: experiment {demand.experiment} of team {demand.team} has a higher priority "
                        f"({demand.priority} > {holding.priority})"
                    )
                    candidates.append(((1, holding.priority, -holding.order), trial_id, why))
            elif reclaiming:
                quota = self.quota(pool, demand.team).describe()
                why = f"preempted: reclaimed by team {demand.team} (its quota on {pool}: {quota})"
                candidates.append(((0, holding.priority, -holding.order), trial_id, why))
        candidates.sort()
        chosen: list[tuple[str, str]] = []
        gpus, trials = free.gpus, free.trials
        losing: dict[str, Use] = defaultdict(Use)  # what the candidates chosen here take from each team
        for _, trial_id, why in candidates:
            holding = self.holdings[trial_id]
            if holding.team != demand.team:  # take no more than the team borrows
                gone = Use(
                    away[holding.team].gpus + losing[holding.team].gpus,
                    away[holding.team].trials + losing[holding.team].trials,
                )
                if not self._borrowed(holding, gone):
                    continue
            losing[holding.team].gpus += holding.gpus
            losing[holding.team].trials += 1
            chosen.append((trial_id, why))
            gpus += holding.gpus
            trials += 1
            if demand.gpus <= gpus + EPSILON and trials >= 1:
                return chosen
        return []

    def _borrowed(self, holding: Holding, gone: Use) -> bool:
        """Whether the holding's team, once ``gone`` is taken from it, still runs beyond its quota (on each
        resource its quota governs that the trial uses): then this trial runs on borrowed capacity, as in
        Kueue, even if taking it leaves the team below its quota (a trial is preempted whole)."""
        quota = self.quota(holding.pool, holding.team)
        use = self.used(holding.pool, holding.team)
        gpus, trials = use.gpus - gone.gpus, use.trials - gone.trials
        if holding.gpus > 0 and quota.gpus is not None and gpus <= quota.gpus + EPSILON:
            return False
        return quota.trials is None or trials > quota.trials

    # ------------------------------------------------------------------ internals

    def _free(self, pool: str, capacity: Capacity, counting_preempted: bool = False) -> _Free:
        total = self.total(pool)
        free = _Free(capacity.gpus - total.gpus, capacity.trials - total.trials)
        if counting_preempted:
            for trial_id in self.preempting:
                holding = self.holdings.get(trial_id)
                if holding is not None and holding.pool == pool:
                    free.take(-holding.gpus, -1)
        return free

    def _current(self, pool: str) -> list[Demand]:
        """The pool's demands, each with what its experiment wants now; those that want nothing dropped."""
        demands = self.demands.get(pool)
        if not demands:
            return []
        for demand in list(demands.values()):
            demand.want = self.wants(demand.experiment)
            if demand.want <= 0:
                del demands[demand.experiment]
        return list(demands.values())

    def _ranked(self, pool: str, capacity: Capacity) -> list[Demand]:
        return sorted(self._current(pool), key=self._keys(pool, capacity))

    def _keys(self, pool: str, capacity: Capacity) -> Callable[[Demand], tuple]:
        """The rank of a demand on ``pool`` (smaller first; the module's docstring), its team's part
        worked out once per team and GPU count."""
        teams: dict[tuple[str, float], tuple[int, float]] = {}

        def key(demand: Demand) -> tuple:
            part = teams.get((demand.team, demand.gpus))
            if part is None:
                part = teams[demand.team, demand.gpus] = (
                    0 if self.within_quota(pool, demand.team, demand.gpus) else 1,
                    self.dominant_share(pool, demand.team, capacity) / self.weight(demand.team),
                )
            return (
                *part,
                -demand.priority,
                self._of_experiment.get((pool, demand.experiment), 0),
                demand.started,
                demand.experiment,
            )

        return key

    def dominant_share(self, pool: str, team: str, capacity: Capacity) -> float:
        use = self.used(pool, team)
        gpus = use.gpus / capacity.gpus if capacity.gpus > 0 else 0.0
        trials = use.trials / capacity.trials if capacity.trials < math.inf else 0.0
        return max(gpus, trials)

    def why(self, pool: str, demand: Demand, capacity: Capacity, ahead: int) -> str:
        """Why ``demand`` waits, for people: what it waits for, its team's quota, how many go before it."""
        free = self._free(pool, capacity)
        use, quota = self.used(pool, demand.team), self.quota(pool, demand.team)
        if demand.gpus > 0:
            need = f"{demand.gpus:g} free GPU{'' if demand.gpus == 1 else 's'}"
            what = f"{max(free.gpus, 0):g} of {capacity.gpus:g} GPUs of {pool} free"
        else:
            need = "a free trial slot"
            what = f"{max(free.trials, 0):g} of {capacity.trials:g} trial slots of {pool} free"
        parts = [f"waiting for {need} ({what})"]
        if quota.gpus is not None and demand.gpus > 0:
            at = "at" if use.gpus + demand.gpus > quota.gpus + EPSILON else "within"
            parts.append(f"team {demand.team} {at} its GPU quota {use.gpus:g}/{quota.gpus:g}")
        elif quota.trials is not None:
            at = "at" if use.trials + 1 > quota.trials else "within"
            parts.append(f"team {demand.team} {at} its trial quota {use.trials}/{quota.trials}")
        else:
            parts.append(f"team {demand.team} has no quota on {pool} (it runs on idle capacity)")
        if ahead:
            parts.append(f"{ahead} experiment{'' if ahead == 1 else 's'} ahead")
        return "; ".join(parts)
