"""``python -m bench.shares`` (``make bench-shares``): how long the dispatcher's sharing decisions take
(services/dispatcher/shares.py) with many teams, experiments and queued trials.

A platform of 64 GPUs, every one held by a trial; ``--teams`` teams (half with a quota of their
share, weights 1 to 3) and ``--experiments`` experiments among them, each with ``--queued`` ÷
``--experiments`` trials queued. Measured: an admission that is refused (the common case on a full
platform: the trial's experiment is ranked against every waiting one), an admission that is granted
(one GPU freed, the best-ranked experiment takes it), and one sweep's preemption decision
(:meth:`Shares.reclaim` over every waiting experiment). Then the same with a tenth of the queued
trials: the figures should not move (a decision costs O(experiments + teams), not O(queued trials)).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from contracts.teams import Quota, Team
from services.dispatcher.shares import Capacity, Demand, Holding, Shares

ADAPTER = "local-gpu"
GPUS = 64


def build(teams: int, experiments: int, queued: int, seed: int = 7) -> tuple[Shares, list[Demand], Capacity]:
    rng = random.Random(seed)
    waiting = {f"e{i}": queued // experiments for i in range(experiments)}
    shares = Shares(wants=lambda e: min(waiting.get(e, 0), 8))
    names = [f"team{i}" for i in range(teams)]
    for i, name in enumerate(names):
        quota = Quota(gpus=GPUS / teams) if i % 2 == 0 else Quota()
        shares.teams[name] = Team(name=name, quota=quota, weight=1 + i % 3)
    demands = [
        Demand(f"e{i}", names[i % teams], priority=rng.randint(0, 3), started=float(i), gpus=1.0)
        for i in range(experiments)
    ]
    capacity = Capacity(gpus=GPUS, trials=GPUS)
    for g in range(GPUS):  # a full platform: the borrowing teams hold more than their share
        owner = demands[(g * 7) % experiments]
        shares.hold(f"t{g}", Holding(ADAPTER, owner.team, owner.experiment, 1.0, owner.priority))
    for demand in demands:
        shares.admit(ADAPTER, demand, capacity)
    return shares, demands, capacity


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


def figures(teams: int, experiments: int, queued: int) -> dict[str, float]:
    shares, demands, capacity = build(teams, experiments, queued)
    refused = timed(lambda: shares.admit(ADAPTER, demands[len(demands) // 2], capacity), 2000)

    def grant() -> None:  # one GPU frees, and the best-ranked experiment takes it
        victim = next(iter(shares.holdings))
        held = shares.release(victim)
        best = shares.ranked(ADAPTER, capacity)[0]
        assert held is not None and shares.admit(ADAPTER, best, capacity) is None
        shares.hold(victim, held)

    granted = timed(grant, 500)

    def reclaim_once() -> None:
        shares.reclaim(ADAPTER, capacity, lambda t: True)
        shares.preempting.clear()

    reclaim = timed(reclaim_once, 50)
    return {
        "refused p50 µs": statistics.median(refused) * 1e6,
        "refused p99 µs": sorted(refused)[int(len(refused) * 0.99)] * 1e6,
        "granted p50 µs": statistics.median(granted) * 1e6,
        "reclaim p50 ms": statistics.median(reclaim) * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=10)
    parser.add_argument("--experiments", type=int, default=100)
    parser.add_argument("--queued", type=int, default=100_000)
    args = parser.parse_args(argv)
    print(f"sharing decisions: {GPUS} GPUs all held, {args.teams} teams, {args.experiments} experiments waiting")
    for queued in (args.queued, args.queued // 10):
        shown = ", ".join(f"{k} {v:.1f}" for k, v in figures(args.teams, args.experiments, queued).items())
        print(f"  {queued:>7} queued trials: {shown}")


if __name__ == "__main__":
    main()
