"""Teams' shares of a platform (services/dispatcher/shares.py): fair share by weight, quotas with
borrowing and reclaim, priorities, backfill, and why a trial waits; with properties over random
teams, quotas and demands."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts import ExperimentConfig
from contracts.teams import Quota, Team
from services.dispatcher.shares import Capacity, Demand, Holding, Shares

A = "local-gpu"
FOUR_GPUS = Capacity(gpus=4, trials=64)


class Platform:
    """Shares driven as the dispatcher drives them: experiments with queues, trials taking capacity
    when admitted, ending, and being preempted."""

    def __init__(self, capacity: Capacity = FOUR_GPUS, teams: list[Team] = ()) -> None:
        self.capacity = capacity
        self.queued: dict[str, int] = {}
        self.experiments: dict[str, Demand] = {}
        self.shares = Shares(wants=lambda e: self.queued.get(e, 0))
        self.shares.teams = {t.name: t for t in teams}
        self.ids = itertools.count()

    def experiment(self, name: str, team: str, *, trials: int = 100, gpus: float = 1, priority: int = 0) -> None:
        self.queued[name] = trials
        self.experiments[name] = Demand(name, team, priority, started=len(self.experiments), gpus=gpus)

    def fill(self) -> list[str]:
        """Admit while anyone may (every experiment asked, as the sweep and the freed-capacity offer do)."""
        admitted = []
        progress = True
        while progress:
            progress = False
            for name, demand in self.experiments.items():
                while self.queued[name] and self.shares.admit(A, demand, self.capacity) is None:
                    trial = f"{name}-{next(self.ids)}"
                    self.shares.hold(trial, Holding(A, demand.team, name, demand.gpus, demand.priority))
                    self.queued[name] -= 1
                    admitted.append(trial)
                    progress = True
                if not self.queued[name]:
                    self.shares.done(name)
        return admitted

    def running(self, team: str | None = None, experiment: str | None = None) -> list[str]:
        return [
            t
            for t, h in self.shares.holdings.items()
            if (team is None or h.team == team) and (experiment is None or h.experiment == experiment)
        ]

    def end(self, trial: str, requeue: bool = False) -> None:
        holding = self.shares.release(trial)
        if requeue and holding:
            self.queued[holding.experiment] += 1

    def preempt(self) -> list[str]:
        """Reclaim, then end the victims (they go back to their queues), as their adapter would."""
        victims = self.shares.reclaim(A, self.capacity, running=lambda t: True)
        for victim in victims:
            self.end(victim.trial_id, requeue=True)
        return [v.trial_id for v in victims]

    def gpus_of(self, team: str) -> float:
        return self.shares.used(A, team).gpus


def team(name: str, gpus: float | None = None, trials: int | None = None, weight: float = 1) -> Team:
    return Team(name=name, quota=Quota(gpus=gpus, trials=trials), weight=weight)


def test_two_teams_without_quotas_share_by_weight_from_the_moment_capacity_frees():
    # Given team a alone on 4 GPUs, taking them all (idle capacity is anyone's)
    p = Platform(teams=[team("a", weight=3), team("b", weight=1)])
    p.experiment("ea", "a")
    p.fill()
    assert p.gpus_of("a") == 4
    # When team b arrives, nothing is preempted (no quota) ...
    p.experiment("eb", "b")
    assert p.fill() == [] and p.preempt() == []
    # ... but each GPU that frees goes to the team with the smaller share per weight: 3 to 1
    for _ in range(8):
        p.end(p.running("a")[0] if p.gpus_of("a") > 3 else p.running()[0])
        p.fill()
    assert (p.gpus_of("a"), p.gpus_of("b")) == (3, 1)


def test_a_team_under_its_quota_reclaims_what_another_borrows_and_the_borrower_waits():
    p = Platform(teams=[team("nlp", gpus=2), team("vision", gpus=2)])
    p.experiment("e1", "vision")
    p.fill()
    assert p.gpus_of("vision") == 4  # borrowing nlp's 2 while idle
    p.experiment("e2", "nlp")
    assert p.fill() == []
    # Then two of vision's trials are preempted, the most recent first, saying by whom
    victims = p.shares.reclaim(A, p.capacity, running=lambda t: True)
    assert [v.trial_id for v in victims] == ["e1-3", "e1-2"]
    assert victims[0].why == "preempted: reclaimed by team nlp (its quota on local-gpu: 2 GPUs)"
    # A second look while they stop preempts nothing more
    assert p.shares.reclaim(A, p.capacity, running=lambda t: True) == []
    for v in victims:
        p.end(v.trial_id, requeue=True)
    # And nlp takes them; vision, at its quota, waits for capacity, saying why
    assert len(p.fill()) == 2
    assert (p.gpus_of("vision"), p.gpus_of("nlp")) == (2, 2)
    why = p.shares.admit(A, p.experiments["e1"], p.capacity)
    assert why.startswith("waiting for 1 free GPU (0 of 4 GPUs of local-gpu free); team vision at its GPU quota 2/2")


def test_a_team_reclaims_up_to_its_quota_and_no_more_however_many_trials_it_has_ready():
    p = Platform(teams=[team("nlp", gpus=2)])
    p.experiment("e1", "vision")
    p.fill()
    p.experiment("e2", "nlp", trials=10)
    assert p.fill() == []
    assert len(p.preempt()) == 2 and p.preempt() == []
    p.fill()
    assert (p.gpus_of("vision"), p.gpus_of("nlp")) == (2, 2)


def test_nothing_is_preempted_from_a_team_within_its_quota():
    p = Platform(teams=[team("a", gpus=2), team("b", gpus=2), team("c", gpus=1)])
    for name in "ab":
        p.experiment(f"e{name}", name, trials=2)
    p.fill()
    p.experiment("ec", "c")
    assert p.fill() == [] and p.preempt() == []
    why = p.shares.admit(A, p.experiments["ec"], p.capacity)
    assert "team c within its GPU quota 0/1" in why


def test_a_higher_priority_experiment_preempts_its_own_team_s_lower_one():
    p = Platform()
    p.experiment("low", "ml", priority=0)
    p.fill()
    p.experiment("high", "ml", trials=2, priority=5)
    assert p.fill() == []
    victims = p.shares.reclaim(A, p.capacity, running=lambda t: True)
    assert len(victims) == 2 and all(v.experiment == "low" for v in victims)
    assert victims[0].why == "preempted: experiment high of team ml has a higher priority (5 > 0)"
    for v in victims:
        p.end(v.trial_id, requeue=True)
    p.fill()
    assert len(p.running(experiment="high")) == 2


def test_priority_does_not_preempt_another_team():
    p = Platform()
    p.experiment("theirs", "a")
    p.fill()
    p.experiment("mine", "b", priority=100)
    assert p.fill() == [] and p.preempt() == []


def test_a_trial_too_big_for_what_is_free_does_not_hold_smaller_ones_back():
    p = Platform()
    p.experiment("small", "a", trials=3)
    p.fill()
    p.experiment("big", "b", gpus=2, trials=1)
    p.experiment("more", "a", trials=5)
    assert p.fill() == ["more-3"]  # one GPU free: too little for big, taken by a 1-GPU trial


def test_a_trial_bigger_than_the_platform_is_not_held_back_here():
    p = Platform()
    p.experiment("huge", "a", gpus=8, trials=1)
    assert p.shares.admit(A, p.experiments["huge"], p.capacity) is None  # its adapter says why it cannot run


def test_unbounded_platforms_are_not_shared_here():
    p = Platform(capacity=Capacity())
    p.experiment("e", "a", gpus=0, trials=1000)
    assert len(p.fill()) == 1000


def test_why_counts_the_experiments_ahead():
    p = Platform(capacity=Capacity(gpus=0, trials=2), teams=[team("vision", trials=2)])
    p.experiment("e0", "vision", gpus=0)
    p.fill()
    for i in range(1, 4):
        p.experiment(f"e{i}", "vision", gpus=0)
        p.shares.admit(A, p.experiments[f"e{i}"], p.capacity)
    why = p.shares.admit(A, p.experiments["e3"], p.capacity)
    assert why == (
        "waiting for a free trial slot (0 of 2 trial slots of local-gpu free); "
        "team vision at its trial quota 2/2; 2 experiments ahead"
    )


teams_st = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 4)), st.sampled_from([0.5, 1, 2, 4]), st.integers(1, 12), st.booleans()
    ),
    min_size=2,
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(teams_st, st.integers(1, 8), st.randoms(use_true_random=False))
def test_properties_of_any_sharing(specs, gpus, rng):
    quotas = [q for q, *_ in specs]
    p = Platform(
        capacity=Capacity(gpus=gpus, trials=64),
        teams=[team(f"t{i}", q, weight=w) for i, (q, w, *_) in enumerate(specs)],
    )
    arrivals = list(enumerate(specs))
    rng.shuffle(arrivals)
    for i, (_quota, _weight, trials, big) in arrivals:
        p.experiment(f"e{i}", f"t{i}", trials=trials, gpus=2 if big and gpus >= 2 else 1)
        p.fill()
        # capacity is never exceeded
        assert p.shares.total(A).gpus <= gpus + 1e-9
        for _ in range(3):
            use = {f"t{j}": p.gpus_of(f"t{j}") for j in range(len(specs))}
            victims = p.shares.reclaim(A, p.capacity, running=lambda t: True)
            for v in victims:
                h = p.shares.holdings[v.trial_id]
                # a trial is preempted for a quota only while its team runs beyond its own quota
                if "reclaimed by" in v.why:
                    assert use[h.team] > (quotas[int(h.team[1:])] or 0), (h.team, use, quotas)
                use[h.team] -= h.gpus
            for v in victims:
                p.end(v.trial_id, requeue=True)
            p.fill()
            assert p.shares.total(A).gpus <= gpus + 1e-9
    # and once settled, every team waiting below its quota got it, or capacity is full of guarantees
    for j, quota in enumerate(quotas):
        name = f"t{j}"
        if quota and p.queued[f"e{j}"] and p.gpus_of(name) < quota:
            free = gpus - p.shares.total(A).gpus
            need = p.experiments[f"e{j}"].gpus
            borrowed = sum(max(0.0, p.gpus_of(f"t{k}") - (quotas[k] or 0)) for k in range(len(quotas)) if k != j)
            assert free + borrowed < need or p.gpus_of(name) + need > quota, (name, quota, p.gpus_of(name))


def test_the_bench_measures_both_sizes(capsys):
    from bench import shares as bench

    bench.main(["--experiments", "20", "--teams", "4", "--queued", "2000"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "sharing decisions: 64 GPUs all held, 4 teams, 20 experiments waiting"
    assert [line.split()[0] for line in lines[1:]] == ["2000", "200"]
    assert all("refused p50 µs" in line and "reclaim p50 ms" in line for line in lines[1:])


def test_each_pool_is_shared_on_its_own_with_the_quota_set_for_it():
    lab, night = "remote/lab", "remote/night"
    shares = Shares(wants=lambda e: 10)
    shares.teams = {"nlp": Team(name="nlp", platforms={lab: Quota(gpus=2), "openpai": Quota(gpus=1)})}
    capacity = {lab: Capacity(gpus=4), night: Capacity(gpus=2)}
    # Given team vision borrowing every GPU of both pools
    for pool, gpus in ((lab, 4), (night, 2)):
        for i in range(gpus):
            assert shares.admit(pool, Demand(f"v-{pool}", "vision", 0, 0.0, 1.0), capacity[pool]) is None
            shares.hold(f"{pool}-{i}", Holding(pool, "vision", f"v-{pool}", 1.0, 0))
    # When team nlp waits in both: where it has no quota, nothing is taken back
    for pool in (night, lab):
        why = shares.admit(pool, Demand(f"n-{pool}", "nlp", 0, 1.0, 1.0), capacity[pool])
        assert why is not None
    assert "team nlp has no quota on remote/night" in shares.why(
        night, shares.demands[night]["n-remote/night"], capacity[night], 0
    )
    assert shares.reclaim(night, capacity[night], running=lambda t: True) == []
    # and in the pool where it has a quota, two of vision's trials there (and only there) are preempted
    victims = shares.reclaim(lab, capacity[lab], running=lambda t: True)
    assert sorted(v.trial_id for v in victims) == ["remote/lab-2", "remote/lab-3"]
    assert victims[0].why == "preempted: reclaimed by team nlp (its quota on remote/lab: 2 GPUs)"
    # A pool's quota is its own, else its platform's, else the team's
    nlp = shares.teams["nlp"]
    assert (nlp.quota_on(lab).gpus, nlp.quota_on("openpai/vision").gpus, nlp.quota_on(night).gpus) == (2, 1, None)


def test_a_pool_s_name_is_checked_where_a_quota_or_an_experiment_names_it():
    with pytest.raises(ValidationError, match="pool 'lab a' of 'remote/lab a' is not a valid name"):
        Team(name="nlp", platforms={"remote/lab a": Quota(gpus=1)})
    with pytest.raises(ValidationError, match="platform 'Remote' is not a valid name"):
        Team(name="nlp", platforms={"Remote/lab": Quota(gpus=1)})
    remote = {"platform": "remote", "machineList": [{"host": "a", "user": "u"}]}
    config = {"trialCommand": "true", "trialConcurrency": 1}
    with pytest.raises(ValidationError, match="pool '../x' is not a valid name"):
        ExperimentConfig.model_validate({**config, "trainingService": {**remote, "pool": "../x"}})
    assert (
        ExperimentConfig.model_validate({**config, "trainingService": {**remote, "pool": "lab-2"}})
        .training_services[0]
        .pool
        == "lab-2"
    )
