"""On a machine with an NVIDIA GPU: real NVML, real nvidia-smi, real CUDA trials.

Skipped where NVML finds no GPU (the development machine and CI have none); the fake
``nvidia-smi`` tests (``test_gpus.py``) cover the same rules everywhere. Run with
``pytest tests/e2e/test_real_gpu.py`` on a GPU host; PyTorch makes the trials' check
stronger (they ask CUDA what they see) but is optional.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.adapters.local_gpu.gpus import GpuReader
from tests.e2e.helpers import wait_until
from tests.fixtures.stack import Stack


def _gpu_count() -> int:
    reader = GpuReader("nvml")
    try:
        return len(reader.read().gpus)
    finally:
        reader.close()


pytestmark = pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU that NVML can see")
HAS_TORCH = importlib.util.find_spec("torch") is not None

TRIAL = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    import nni

    params = nni.get_next_parameter()
    seen = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
            "order": os.environ.get("CUDA_DEVICE_ORDER")}
    try:
        import torch
        seen["torch_count"] = torch.cuda.device_count()
        if seen["torch_count"]:
            x = torch.ones(256, 1024, 1024, device="cuda")  # 1 GiB: the trial shows up in NVML
            seen["uuid"] = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    except ImportError:
        pass
    print("SEEN " + json.dumps(seen), flush=True)
    time.sleep(params.get("sleep", 0))
    nni.report_final_result(1.0)
    """
)


@pytest.fixture
def stack(tmp_path: Path, nats_server, request):
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    env = {"TRIALBUS_GPU_REFRESH": "0.5", "TRIALBUS_STATUS_INTERVAL": "1"}  # /platforms follows the GPUs closely
    stack = Stack(root=tmp_path, nats=nats_server, extra_env=env)
    stack.start()
    stack.code = code
    yield stack
    stack.stop()
    if getattr(request.node, "rep_call", None) and request.node.rep_call.failed:
        print(stack.logs(), file=sys.stderr)


def experiment(stack, **overrides) -> str:
    config = {
        "trialCommand": f"{sys.executable} trial.py",
        "trialCodeDirectory": str(stack.code),
        "trialConcurrency": 2,
        "trainingService": {"platform": "local", "useActiveGpu": False},
        **overrides,
    }
    return stack.rest("POST", "/experiments", json=config).json()["id"]


def submit(stack, exp: str, **parameters) -> str:
    return stack.rest("POST", f"/experiments/{exp}/trials", json={"parameters": parameters}).json()["id"]


def trial(stack, trial_id: str) -> dict:
    return stack.rest("GET", f"/trials/{trial_id}").json()


def seen(stack, trial_id: str) -> dict:
    log = stack.rest("GET", f"/trials/{trial_id}/log").text
    line = next(line for line in log.splitlines() if line.startswith("SEEN "))
    return json.loads(line[5:])


def smi(*query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.strip().splitlines()]


def test_nvml_inventory_matches_nvidia_smi():
    nvml, xml = GpuReader("nvml"), GpuReader("nvidia-smi")
    try:
        a, b = nvml.read(), xml.read()
    finally:
        nvml.close()
    assert (a.source, b.source) == ("nvml", "nvidia-smi")
    listed = smi("index", "uuid", "name", "memory.total")
    assert [(g.index, g.uuid, g.name, g.memory_total_mib) for g in a.gpus] == [
        (int(i), uuid, name, int(total)) for i, uuid, name, total in listed
    ]
    assert [(g.index, g.uuid, g.name, g.memory_total_mib) for g in b.gpus] == [
        (g.index, g.uuid, g.name, g.memory_total_mib) for g in a.gpus
    ]


def test_a_trial_sees_exactly_its_gpu_and_counts_as_ours(stack):
    exp = experiment(stack, trialGpuNumber=1)
    trial_id = submit(stack, exp, sleep=8)
    wait_until(lambda: trial(stack, trial_id)["status"] == "RUNNING", 30, "RUNNING")
    # while it runs, the platform shows it on its GPU, and its CUDA process is not "foreign"
    def on_gpu():
        gpus = stack.rest("GET", "/platforms").json()[0]["gpus"]
        return next((g for g in gpus if f"{trial_id}:0" in g["trials"] and g["memoryUsedMib"] > 900), None)

    gpu = wait_until(on_gpu, 20, "the trial on its GPU in /platforms")
    assert gpu["foreignProcesses"] == 0
    wait_until(lambda: trial(stack, trial_id)["status"] == "SUCCEEDED", 30, "SUCCEEDED")
    view = seen(stack, trial_id)
    assert view["visible"] == str(gpu["index"]) and view["order"] == "PCI_BUS_ID"
    if HAS_TORCH:
        assert view["torch_count"] == 1 and view["uuid"] == gpu["uuid"]


def test_trial_gpu_number_zero_hides_every_gpu(stack):
    exp = experiment(stack, trialGpuNumber=0, trainingService={"platform": "local"})
    trial_id = submit(stack, exp)
    wait_until(lambda: trial(stack, trial_id)["status"] == "SUCCEEDED", 30, "SUCCEEDED")
    view = seen(stack, trial_id)
    assert view["visible"] == ""
    if HAS_TORCH:
        assert view["torch_count"] == 0


@pytest.mark.skipif(not HAS_TORCH, reason="a foreign CUDA process is made with PyTorch")
def test_a_foreign_process_holds_the_gpu_until_it_exits(stack):
    indices = [int(row[0]) for row in smi("index")]
    hog = subprocess.Popen(
        [sys.executable, "-c", "import torch, time; x = torch.ones(1 << 28, device='cuda'); print('up', flush=True); "
                               "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert hog.stdout.readline().strip() == "up"
        # placement goes by the last inventory read: wait until the adapter has seen the hog
        wait_until(lambda: any(g["foreignProcesses"] for g in stack.rest("GET", "/platforms").json()[0]["gpus"]),
                   10, "the hog in /platforms")
        exp = experiment(stack, trialGpuNumber=len(indices))  # needs every GPU, so the hog's too
        trial_id = submit(stack, exp)
        body = wait_until(lambda: (b := trial(stack, trial_id)).get("message") and "GPU" in b["message"] and b, 20,
                          "a waiting message about GPUs")
        assert body["status"] == "WAITING" and "not trials (useActiveGpu is false)" in body["message"]
        time.sleep(1.0)
        assert trial(stack, trial_id)["status"] == "WAITING"
        hog.kill()
        hog.wait()
        freed = time.time()
        wait_until(lambda: trial(stack, trial_id)["status"] != "WAITING", 10, "the trial to start")
        print(f"foreign process gone → trial RUNNING in {time.time() - freed:.2f}s (upper bound)")
        wait_until(lambda: trial(stack, trial_id)["status"] == "SUCCEEDED", 30, "SUCCEEDED")
    finally:
        hog.kill()
