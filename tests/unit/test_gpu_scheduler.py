"""The GPU scheduler's bookkeeping: waiters and reservations, peers with idle GPUs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from contracts import GpuStatus, PlatformStatus
from contracts.base import utcnow
from services.adapters.errors import Waiting
from services.adapters.gpu.inventory import Gpu, Inventory
from services.adapters.gpu.placement import GpuAsk
from services.adapters.gpu.scheduler import GpuScheduler, Holding
from services.adapters.local_gpu.settings import LocalGpuSettings
from tests.fixtures.gpus import install_fake_nvidia_smi, set_fake_gpus


def scheduler(tmp_path: Path, holdings: list[Holding], gpus: int = 2, **settings) -> GpuScheduler:
    config = LocalGpuSettings(work_dir=tmp_path, replica="here", gpu_source="none", **settings)
    sched = GpuScheduler(config, "local-gpu", lambda: holdings, lambda: None)
    sched.inventory = Inventory("nvidia-smi", tuple(Gpu(i, f"GPU-{i}", "A100", 40960, 0, 0, 0) for i in range(gpus)))
    return sched


def test_the_oldest_waiter_gets_a_reservation_that_small_trials_respect(tmp_path):
    holdings = [Holding("a:0", (0,), 1, None), Holding("b:0", (1,), 1, None)]
    sched = scheduler(tmp_path, holdings, gpu_reserve_after=0)
    big = GpuAsk("big:0", 2)
    with pytest.raises(Waiting):
        sched.place(big)  # waits, and from now on holds a reservation on GPUs 0 and 1
    holdings.pop(0)  # trial a ends: GPU 0 is free
    with pytest.raises(Waiting, match="reserved for trial big"):
        sched.place(GpuAsk("small:0", 1))
    holdings.pop(0)  # trial b ends
    assert sched.place(big) == (0, 1)


def test_without_the_wait_a_small_trial_takes_the_free_gpu(tmp_path):
    holdings = [Holding("a:0", (0,), 1, None)]
    sched = scheduler(tmp_path, holdings, gpu_reserve_after=3600)
    with pytest.raises(Waiting, match="waiting for 2 free GPUs"):
        sched.place(GpuAsk("big:0", 2))
    assert sched.place(GpuAsk("small:0", 1)) == (1,)


def peer(replica: str, *gpus: GpuStatus) -> PlatformStatus:
    return PlatformStatus(adapter="local-gpu", replica=replica, host=replica, time=utcnow(), gpus=list(gpus))


def gpu(index: int, trials: list[str] | None = None, foreign: int = 0) -> GpuStatus:
    return GpuStatus(
        index=index,
        uuid=f"GPU-{index}",
        name="A100",
        memory_total_mib=40960,
        memory_used_mib=0,
        trials=trials or [],
        foreign_processes=foreign,
    )


def test_a_peer_with_idle_gpus_is_offered_the_trial(tmp_path):
    sched = scheduler(tmp_path, [])
    sched.peers = [peer("busy", gpu(0, ["x:0"]), gpu(1, foreign=1)), peer("idle", gpu(0), gpu(1))]
    assert sched.room_elsewhere(GpuAsk("t:0", 2)) == "idle"
    assert sched.room_elsewhere(GpuAsk("t:0", 1, use_active=True)) == "busy"  # GPU 1 only has a foreign process
    assert sched.room_elsewhere(GpuAsk("t:0", 3)) is None
    assert sched.room_elsewhere(GpuAsk("t:0", 1, indices=(5,))) is None


async def test_a_foreign_process_that_exits_between_two_reads_wakes_the_waiting_trials(tmp_path, monkeypatch):
    foreign = subprocess.Popen(["sleep", "60"])
    try:
        env = install_fake_nvidia_smi(tmp_path / "smi", [{"name": "A100", "processes": [{"pid": foreign.pid}]}])
        monkeypatch.setenv("PATH", env["PATH"])
        monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", env["FAKE_NVIDIA_SMI_STATE"])
        config = LocalGpuSettings(work_dir=tmp_path, replica="here", gpu_source="nvidia-smi")
        freed: list[bool] = []
        sched = GpuScheduler(config, "local-gpu", lambda: [], lambda: freed.append(True))
        await sched.read()
        with pytest.raises(Waiting, match="not trials"):
            sched.place(GpuAsk("t:0", 1))
        foreign.kill()
        foreign.wait()
        set_fake_gpus(env, [{"name": "A100"}])  # nvidia-smi stops listing it
        await sched.read()
        assert freed == [True]  # the held trials are offered again at once
        assert sched.place(GpuAsk("t:0", 1)) == (0,)
    finally:
        foreign.kill()
