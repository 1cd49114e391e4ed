"""Where a hybrid experiment's trial goes (services/dispatcher/placement.py), from statuses as adapters publish them."""

from __future__ import annotations

from datetime import timedelta

from contracts import ExperimentConfig, GpuStatus, MachineStatus, PlatformStatus
from contracts.base import utcnow
from services.dispatcher.placement import Placement

REMOTE = {"platform": "remote", "machineList": [{"host": "a", "user": "u"}, {"host": "b", "user": "u"}]}


def config(*services: dict, gpus: int = 0) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {"trialCommand": "true", "trialConcurrency": 8, "trialGpuNumber": gpus, "trainingService": list(services)}
    )


def status(adapter: str, replica: str = "r1", age: float = 0.0, **fields) -> PlatformStatus:
    return PlatformStatus(adapter=adapter, replica=replica, host="h", time=utcnow() - timedelta(seconds=age), **fields)


def placement(*statuses: PlatformStatus) -> Placement:
    chosen = Placement(stale_after=15)
    for s in statuses:
        chosen.status(f"{s.adapter}.{s.replica}", s)
    return chosen


def test_trials_spread_evenly_over_platforms_with_room():
    exp = config({"platform": "local"}, REMOTE)
    chosen = placement(
        status("local-gpu", max_trials=4), status("remote", machines=[MachineStatus(name="u@a:22", up=True, cpus=2)])
    )
    picks = []
    for _ in range(6):
        adapter = chosen.choose("e", exp)
        picks.append(adapter)
        chosen.occupy("e", adapter)
    # remote: machine a has 2 CPUs, b is not connected yet (counts as one): room 3; local: 4.
    assert picks == ["local-gpu", "remote", "local-gpu", "remote", "local-gpu", "remote"]
    assert chosen.choose("e", exp) == "local-gpu"  # remote is full (3 sent), local has one more
    chosen.occupy("e", "local-gpu")
    assert chosen.choose("e", exp) is None
    assert chosen.why_waiting(exp) == "waiting for a platform with room: local is full; remote is full"
    chosen.release("e", "remote")
    assert chosen.choose("e", exp) == "remote"


def test_a_platform_down_or_holding_waiting_requests_gets_nothing():
    exp = config({"platform": "local"}, REMOTE)
    down = [MachineStatus(name="u@a:22", up=False, error="refused"), MachineStatus(name="u@b:22", up=False)]
    chosen = placement(status("local-gpu", max_trials=4, waiting=["t:0"]), status("remote", machines=down))
    assert chosen.choose("e", exp) is None
    assert chosen.why_waiting(exp) == (
        "waiting for a platform with room: local is full; remote is down (no machine reachable)"
    )
    stale = placement(status("local-gpu", max_trials=4, age=20), status("remote", machines=[down[0]]))
    assert stale.choose("e", exp) == "remote"  # machine b was never reported: usable
    assert "local is down (no local-gpu adapter replica published its status in 15s)" in stale.why_waiting(exp)
    chosen.status("remote.r1", None)  # the replica stopped and deleted its entry
    assert "remote is down (no remote adapter replica" in chosen.why_waiting(exp)


def test_clusters_queue_so_openpai_has_room_while_it_answers():
    pai = {
        "platform": "openpai",
        "host": "h",
        "username": "u",
        "token": "t",
        "trialCpuNumber": 1,
        "trialMemorySize": "1gb",
        "storageConfigName": "s",
        "localStorageMountPoint": "/s",
        "containerStorageMountPoint": "/s",
    }
    exp = config({"platform": "local"}, pai)
    chosen = placement(status("local-gpu", max_trials=1), status("openpai", clusters=[{"name": "u@h"}]))
    chosen.occupy("e", "local-gpu")
    for _ in range(5):
        assert chosen.choose("e", exp) == "openpai"
        chosen.occupy("e", "openpai")
    failing = placement(status("openpai", clusters=[{"name": "u@h", "error": "connection refused"}]))
    assert failing.choose("e", exp) is None


def test_gpu_trials_count_gpus_times_trials_per_gpu():
    gpus = [GpuStatus(index=i, uuid=f"GPU-{i}", name="H100", memory_total_mib=80, memory_used_mib=0) for i in range(2)]
    exp = config({"platform": "local", "useActiveGpu": True, "maxTrialNumberPerGpu": 2}, REMOTE, gpus=1)
    chosen = placement(status("local-gpu", max_trials=64, gpus=gpus))
    for _ in range(4):
        assert chosen.choose("e", exp) == "local-gpu"
        chosen.occupy("e", "local-gpu")
    assert chosen.choose("e", exp) is None


def test_each_pool_shares_its_own_gpus_a_remote_pool_s_machines_and_an_openpai_virtual_cluster_s():
    pai = {
        "platform": "openpai",
        "host": "h",
        "username": "u",
        "token": "t",
        "trialCpuNumber": 1,
        "trialMemorySize": "1gb",
        "storageConfigName": "s",
        "localStorageMountPoint": "/s",
        "containerStorageMountPoint": "/s",
    }
    gpu = [GpuStatus(index=i, uuid=f"GPU-{i}", name="H100", memory_total_mib=80, memory_used_mib=0) for i in range(2)]
    machines = [
        MachineStatus(name="u@a:22", up=True, gpus=gpu, pools=["lab"]),
        MachineStatus(name="u@b:22", up=True, gpus=gpu, pools=["lab", "night"]),
        MachineStatus(name="u@c:22", up=True, gpus=gpu[:1]),
        MachineStatus(name="u@d:22", up=False, gpus=gpu, pools=["lab"]),  # down: nothing to share
    ]
    clusters = [{"name": "u@h", "virtual_clusters": {"default": 8, "vision": 4}}, {"name": "v@h"}]
    chosen = placement(status("remote", machines=machines), status("openpai", clusters=clusters))
    # Which pool a trial takes from: the remote pool its experiment names, the job's virtual cluster
    assert chosen.pool_of(config({**REMOTE, "pool": "lab"}), "remote") == "remote/lab"
    assert chosen.pool_of(config(REMOTE), "remote") == "remote"
    assert chosen.pool_of(config(pai), "openpai") == "openpai/default"
    assert chosen.pool_of(config({**pai, "virtualCluster": "vision"}), "openpai") == "openpai/vision"
    job = {"defaults": {"virtualCluster": "nlp"}, "taskRoles": {}}
    assert chosen.pool_of(config({**pai, "virtualCluster": "vision", "openpaiConfig": job}), "openpai") == "openpai/nlp"
    # What each pool has: its machines' GPUs, the virtual cluster's; the whole remote adapter: every machine's
    assert (chosen.capacity("remote/lab").gpus, chosen.capacity("remote/night").gpus) == (4, 2)
    assert chosen.capacity("remote").gpus == 5
    assert chosen.capacity("openpai/default").gpus == 8 and chosen.capacity("openpai/vision").gpus == 4
    # A virtual cluster whose GPUs OpenPAI does not say is not shared here: its jobs queue on the cluster
    assert not chosen.capacity("openpai/nlp").bounded and not chosen.capacity("openpai").bounded
    assert not chosen.capacity("remote/nowhere").bounded
