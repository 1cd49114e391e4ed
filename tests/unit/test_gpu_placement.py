"""GPU placement rules (services/adapters/gpu/placement.py) on injected inventories."""

from __future__ import annotations

import pytest

from services.adapters.gpu.placement import GpuAsk, GpuView, Never, Placed, Snapshot, Wait, place, reserve


def gpus(n: int, **by_index: GpuView) -> list[GpuView]:
    return [by_index.get(f"g{i}", GpuView(i)) for i in range(n)]


def ask(count: int = 1, **kw) -> GpuAsk:
    return GpuAsk(trial=kw.pop("trial", "t:0"), count=count, **kw)


def test_takes_the_least_loaded_gpus_and_sets_their_indices():
    host = gpus(4, g0=GpuView(0, ours=(2,)), g1=GpuView(1, memory_used_mib=900), g3=GpuView(3, gpu_util=50))
    result = place(ask(2, per_gpu=2), Snapshot(host))
    assert result == Placed((2, 3))  # GPU 0 has a trial, GPU 1 memory in use, GPU 3 busier than 2: 2 then 3
    assert result.cuda_visible_devices == "2,3"


def test_a_trial_may_take_every_gpu_of_the_host():
    assert place(ask(4), Snapshot(gpus(4))) == Placed((0, 1, 2, 3))


def test_more_gpus_than_the_host_has_can_never_run_here():
    result = place(ask(3), Snapshot(gpus(2)))
    assert isinstance(result, Never)
    assert result.reason == "trialGpuNumber is 3 but this host has 2 GPUs"


def test_no_gpu_at_all():
    result = place(ask(1), Snapshot([]))
    assert isinstance(result, Never) and "has no GPU" in result.reason


def test_gpu_indices_limit_the_candidates_and_name_missing_gpus():
    assert place(ask(1, indices=(2,)), Snapshot(gpus(4))) == Placed((2,))
    result = place(ask(2, indices=(1, 7)), Snapshot(gpus(4)))
    assert isinstance(result, Never)
    assert result.reason == "trialGpuNumber is 2 but this host has 4 GPUs (1 of them in gpuIndices [1, 7]; no GPU 7)"


def test_one_trial_per_gpu_by_default():
    host = gpus(2, g0=GpuView(0, ours=(1,)))
    assert place(ask(1), Snapshot(host)) == Placed((1,))
    result = place(ask(2), Snapshot(host))
    assert isinstance(result, Wait)
    assert result.reason == (
        "waiting for 2 free GPUs (1 free now): GPU 0 runs 1 trial(s), the most maxTrialNumberPerGpu 1 allows"
    )


def test_sharing_up_to_max_trial_number_per_gpu():
    host = gpus(1, g0=GpuView(0, ours=(3, 3)))
    assert place(ask(1, per_gpu=3), Snapshot(host)) == Placed((0,))
    assert isinstance(place(ask(1, per_gpu=3), Snapshot(gpus(1, g0=GpuView(0, ours=(3, 3, 3))))), Wait)


def test_sharing_never_exceeds_what_a_trial_already_there_allowed():
    host = gpus(1, g0=GpuView(0, ours=(1,)))  # a trial that wants its GPU alone
    result = place(ask(1, per_gpu=4), Snapshot(host))
    assert isinstance(result, Wait) and "maxTrialNumberPerGpu 1" in result.reason
    # and a newcomer that wants to be alone does not join a shared GPU
    assert isinstance(place(ask(1, per_gpu=1), Snapshot(gpus(1, g0=GpuView(0, ours=(4,))))), Wait)


def test_foreign_processes_block_a_gpu_unless_use_active_gpu():
    host = gpus(2, g0=GpuView(0, foreign=1), g1=GpuView(1, foreign=2))
    result = place(ask(1), Snapshot(host))
    assert isinstance(result, Wait)
    assert "GPU 0 runs 1 process(es) that are not trials (useActiveGpu is false)" in result.reason
    assert place(ask(1, use_active=True), Snapshot(host)) == Placed((0,))  # fewer foreign processes first


def test_a_reserved_gpu_goes_only_to_its_trial():
    host = gpus(2)
    snapshot = Snapshot(host, reserved={0: "big:0", 1: "big:0"})
    result = place(ask(1, trial="small:0"), snapshot)
    assert isinstance(result, Wait) and "reserved for trial big" in result.reason
    assert place(ask(2, trial="big:0"), snapshot) == Placed((0, 1))


def test_no_head_of_line_blocking_a_small_trial_is_not_held_behind_a_big_one():
    host = gpus(4, g0=GpuView(0, ours=(1,)), g1=GpuView(1, ours=(1,)))
    assert isinstance(place(ask(4, trial="big:0"), Snapshot(host)), Wait)
    assert place(ask(1, trial="small:0"), Snapshot(host)) == Placed((2,))


def test_a_reservation_takes_the_gpus_that_drain_soonest():
    host = gpus(4, g0=GpuView(0, ours=(2, 2)), g1=GpuView(1, ours=(2,)), g3=GpuView(3, ours=(2,)))
    assert reserve(ask(2, trial="big:0"), host) == (1, 2)  # 2 is free, then 1 and 3 tie: lowest index


@pytest.mark.parametrize("seed", range(20))
def test_a_waiting_big_trial_is_never_starved(seed):
    """Small 1-GPU trials arrive all the time; a 3-GPU trial waits. With its reservation
    recomputed at every step (as the adapter does), it starts after finitely many ends."""
    import random

    rng = random.Random(seed)
    running: dict[str, tuple[int, ...]] = {"s0": (0,), "s1": (1,), "s2": (2,), "s3": (3,)}
    big = ask(3, trial="big:0")
    started_small = 4
    for step in range(200):
        host = [GpuView(i, ours=tuple(1 for held in running.values() if i in held)) for i in range(4)]
        reserved = dict.fromkeys(reserve(big, host), big.trial)
        result = place(big, Snapshot(host, reserved))
        if isinstance(result, Placed):
            assert step < 20
            return
        # one running trial ends, then small trials take whatever they may
        running.pop(rng.choice(sorted(running)))
        for _ in range(2):
            host = [GpuView(i, ours=tuple(1 for held in running.values() if i in held)) for i in range(4)]
            small = place(ask(1, trial=f"s{started_small}:0"), Snapshot(host, reserved))
            if isinstance(small, Placed):
                running[f"s{started_small}"] = small.indices
                started_small += 1
    pytest.fail("the 3-GPU trial never started")


def test_without_a_reservation_small_trials_can_starve_a_big_one():
    """The reason reservations exist: the same stream of small trials, no reservation."""
    running = {"s0": (0,), "s1": (1,)}
    big = ask(2, trial="big:0")
    for n in range(50):
        host = [GpuView(i, ours=tuple(1 for held in running.values() if i in held)) for i in range(2)]
        assert not isinstance(place(big, Snapshot(host)), Placed)
        ended = sorted(running)[0]
        freed = running.pop(ended)
        host = [GpuView(i, ours=tuple(1 for held in running.values() if i in held)) for i in range(2)]
        assert place(ask(1, trial=f"n{n}:0"), Snapshot(host)) == Placed(freed)
        running[f"n{n}"] = freed


def test_reservation_prefers_gpus_no_foreign_process_blocks():
    host = gpus(3, g0=GpuView(0, foreign=1), g1=GpuView(1, ours=(1,)))
    assert reserve(ask(2), host) == (1, 2)
    assert reserve(ask(2, use_active=True), host) == (0, 2)
