"""The local-gpu adapter's GPU inventory: the nvidia-smi XML parser, and GpuReader's sources."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from services.adapters.gpu.inventory import Gpu, GpuProcess, GpuReader, Inventory, parse_nvidia_smi_xml
from tests.fixtures.gpus import install_fake_nvidia_smi, set_fake_gpus

# Trimmed from `nvidia-smi -q -x` on an H100 (driver 580.159.04).
HEAD = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">
<nvidia_smi_log>
	<driver_version>580.159.04</driver_version>
	<attached_gpus>{count}</attached_gpus>
"""
GPU = """	<gpu id="00000000:00:06.0">
		<product_name>NVIDIA H100 80GB HBM3</product_name>
		<uuid>{uuid}</uuid>
		<minor_number>0</minor_number>
		<fb_memory_usage>
			<total>81559 MiB</total>
			<reserved>480 MiB</reserved>
			<used>{used}</used>
			<free>79437 MiB</free>
		</fb_memory_usage>
		<utilization>
			<gpu_util>{gpu_util}</gpu_util>
			<memory_util>0 %</memory_util>
		</utilization>
		<processes>{processes}
		</processes>
	</gpu>
"""
PROCESS = """
			<process_info>
				<gpu_instance_id>N/A</gpu_instance_id>
				<compute_instance_id>N/A</compute_instance_id>
				<pid>{pid}</pid>
				<type>{type}</type>
				<process_name>python3</process_name>
				<used_memory>{used}</used_memory>
			</process_info>"""
H100_UUID = "GPU-a332ba40-10e1-b82e-13d7-00fa589c0a60"


def gpu_xml(used: str = "0 MiB", gpu_util: str = "0 %", processes: str = "", uuid: str = H100_UUID) -> str:
    return GPU.format(uuid=uuid, used=used, gpu_util=gpu_util, processes=processes)


def process_xml(pid: int, kind: str, used: str) -> str:
    return PROCESS.format(pid=pid, type=kind, used=used)


def document(*gpus: str) -> str:
    return HEAD.format(count=len(gpus)) + "".join(gpus) + "\n</nvidia_smi_log>\n"


def h100(**kwargs: str) -> str:
    return document(gpu_xml(**kwargs))


# -- the parser --------------------------------------------------------------------------------


def test_parses_an_idle_h100():
    assert parse_nvidia_smi_xml(h100()) == (
        Gpu(0, H100_UUID, "NVIDIA H100 80GB HBM3", 81559, 0, gpu_util=0, memory_util=0, processes=()),
    )


def test_parses_a_busy_h100_with_a_compute_process():
    (gpu,) = parse_nvidia_smi_xml(h100(used="1643 MiB", gpu_util="37 %", processes=process_xml(479, "C", "1634 MiB")))
    assert (gpu.memory_used_mib, gpu.gpu_util) == (1643, 37)
    assert gpu.processes == (GpuProcess(pid=479, type="compute", used_memory_mib=1634),)


def test_na_values_become_none():
    (gpu,) = parse_nvidia_smi_xml(
        h100(gpu_util="N/A", processes=process_xml(5, "C", "N/A")).replace(
            "<memory_util>0 %</memory_util>", "<memory_util>[Not Supported]</memory_util>"
        )
    )
    assert (gpu.gpu_util, gpu.memory_util) == (None, None)
    assert gpu.processes == (GpuProcess(pid=5, type="compute", used_memory_mib=None),)


def test_missing_optional_elements_are_tolerated():
    text = "<nvidia_smi_log><gpu><uuid>GPU-x</uuid><product_name>T4</product_name>"
    text += "<fb_memory_usage><total>15360 MiB</total><used>3 MiB</used></fb_memory_usage></gpu></nvidia_smi_log>"
    assert parse_nvidia_smi_xml(text) == (Gpu(0, "GPU-x", "T4", 15360, 3, None, None, ()),)


def test_two_gpus_in_document_order_with_mixed_process_types():
    text = document(
        gpu_xml(processes=process_xml(10, "C", "100 MiB") + process_xml(11, "G", "5 MiB")),
        gpu_xml(processes=process_xml(12, "C+G", "200 MiB"), uuid="GPU-second"),
    )
    first, second = parse_nvidia_smi_xml(text)
    assert (first.index, first.uuid, second.index, second.uuid) == (0, H100_UUID, 1, "GPU-second")
    assert first.processes == (GpuProcess(10, "compute", 100), GpuProcess(11, "graphics", 5))
    assert second.processes == (GpuProcess(12, "compute", 200),)


def test_no_gpus():
    assert parse_nvidia_smi_xml(document()) == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<html><body>502</body></html>", "root element is <html>"),
        ("NVIDIA-SMI has failed", "not XML"),
        ("<nvidia_smi_log><gpu><product_name>X</product_name></gpu></nvidia_smi_log>", "no <uuid>"),
        (h100(used="N/A"), "fb_memory_usage/used"),
    ],
)
def test_rejects_xml_that_is_not_nvidia_smis(text, message):
    with pytest.raises(ValueError, match=message):
        parse_nvidia_smi_xml(text)


# -- nvidia-smi through the fake ---------------------------------------------------------------


def fake_gpu(name: str, used: int, processes: list[dict]) -> dict:
    return {
        "name": name,
        "memoryTotalMib": 40960,
        "memoryUsedMib": used,
        "gpuUtil": 7,
        "memoryUtil": 3,
        "processes": processes,
    }


THREE = [
    fake_gpu("NVIDIA A100", 500, [{"pid": 123, "type": "C", "usedMemoryMib": 500}]),
    fake_gpu("NVIDIA A100", 0, []),
    fake_gpu("NVIDIA A100", 80, [{"pid": 77, "type": "G", "usedMemoryMib": None}, {"pid": 78, "type": "C+G"}]),
]


def test_reads_fake_gpus_and_sees_changes(tmp_path: Path, monkeypatch):
    env = install_fake_nvidia_smi(tmp_path, THREE)
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", env["FAKE_NVIDIA_SMI_STATE"])
    reader = GpuReader("nvidia-smi", nvidia_smi=str(tmp_path / "bin" / "nvidia-smi"))
    inventory = reader.read()
    assert (inventory.source, inventory.error) == ("nvidia-smi", None)
    assert [g.index for g in inventory.gpus] == [0, 1, 2]
    assert len({g.uuid for g in inventory.gpus}) == 3
    assert inventory.gpus[0] == Gpu(
        0, inventory.gpus[0].uuid, "NVIDIA A100", 40960, 500, 7, 3, (GpuProcess(123, "compute", 500),)
    )
    assert inventory.gpus[2].processes == (GpuProcess(77, "graphics", None), GpuProcess(78, "compute", None))

    set_fake_gpus(env, [fake_gpu("NVIDIA A100", 900, [{"pid": 9, "type": "C", "usedMemoryMib": 900}])])
    (gpu,) = reader.read().gpus
    assert (gpu.memory_used_mib, gpu.processes) == (900, (GpuProcess(9, "compute", 900),))


def test_nvidia_smi_failing_is_an_inventory_with_the_exit(tmp_path: Path, monkeypatch):
    install_fake_nvidia_smi(tmp_path, THREE)
    monkeypatch.delenv("FAKE_NVIDIA_SMI_STATE", raising=False)
    inventory = GpuReader("nvidia-smi", nvidia_smi=str(tmp_path / "bin" / "nvidia-smi")).read()
    assert (inventory.source, inventory.gpus) == ("nvidia-smi", ())
    assert "exited with status 9" in inventory.error
    assert "couldn't communicate with the NVIDIA driver" in inventory.error


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("exec sleep 5", "nvidia-smi -q -x timed out after 0.2 s"),
        ("echo '<html/>'; echo 'a warning' >&2", "not nvidia-smi XML: the root element is <html>"),
        ("echo driver gone >&2; exit 3", "nvidia-smi -q -x exited with status 3: driver gone"),
    ],
)
def test_nvidia_smi_failures(tmp_path: Path, script: str, error: str):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n")
    smi.chmod(0o755)
    inventory = GpuReader("nvidia-smi", nvidia_smi=str(smi), timeout=0.2).read()
    assert (inventory.source, inventory.gpus) == ("nvidia-smi", ())
    assert error in inventory.error


def test_forced_nvidia_smi_that_is_missing(tmp_path: Path):
    inventory = GpuReader("nvidia-smi", nvidia_smi=str(tmp_path / "nope")).read()
    assert (inventory.source, inventory.gpus) == ("nvidia-smi", ())
    assert "does not exist" in inventory.error


def test_none_is_disabled():
    assert GpuReader("none").read().error == "GPU inventory disabled (gpu_source=none)"


# -- auto on this machine: no NVML library ----------------------------------------------------


#: NVML on a host without the NVIDIA driver, whatever the host running the tests has.
def no_nvml() -> FakeNvml:
    return FakeNvml([], init_error="NVML Shared Library Not Found")


def test_auto_falls_back_to_nvidia_smi_on_path(tmp_path: Path, monkeypatch):
    for name, value in install_fake_nvidia_smi(tmp_path, THREE).items():
        monkeypatch.setenv(name, value)
    inventory = GpuReader("auto", nvml=no_nvml()).read()
    assert (inventory.source, inventory.error, len(inventory.gpus)) == ("nvidia-smi", None, 3)


def test_auto_without_nvml_or_nvidia_smi_has_no_gpus(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    reader = GpuReader("auto", nvml=no_nvml())
    inventory = reader.read()
    assert (inventory.source, inventory.gpus) == ("none", ())
    assert "NVML cannot be loaded" in inventory.error
    assert "nvidia-smi is not on PATH" in inventory.error
    # The source is decided once: a fake appearing later is not picked up.
    for name, value in install_fake_nvidia_smi(tmp_path, THREE).items():
        monkeypatch.setenv(name, value)
    assert reader.read().source == "none"


# -- NVML through a stand-in of pynvml ----------------------------------------------------------


class FakeNvml:
    """The few pynvml calls GpuReader makes, over a list of devices."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, devices: list[dict], init_error: str | None = None) -> None:
        self.devices, self.init_error = devices, init_error
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise self.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        if handle.get("lost"):
            raise self.NVMLError("GPU is lost")
        return SimpleNamespace(total=handle["total"], used=handle["used"], free=handle["total"] - handle["used"])

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle.get("util") is None:
            raise self.NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(gpu=handle["util"][0], memory=handle["util"][1])

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.get("compute", [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.get("graphics", [])]


MIB = 2**20
DEVICES = [
    {
        "uuid": "GPU-aaa",
        "name": b"NVIDIA H100 80GB HBM3",
        "total": 81559 * MIB,
        "used": 1643 * MIB + 5,
        "util": (37, 12),
        "compute": [(479, 1634 * MIB), (480, None)],
        "graphics": [(479, 2 * MIB), (900, 3 * MIB)],
    },
    {"uuid": "GPU-bbb", "name": "NVIDIA H100 80GB HBM3", "total": 81559 * MIB, "used": 0, "util": None},
]


def test_nvml_reads_gpus_and_stays_initialised():
    nvml = FakeNvml(DEVICES)
    reader = GpuReader("auto", nvml=nvml)
    first, second = reader.read(), reader.read()
    assert (first.source, first.error, nvml.inits) == ("nvml", None, 1)
    assert (
        first.gpus
        == second.gpus
        == (
            Gpu(
                0,
                "GPU-aaa",
                "NVIDIA H100 80GB HBM3",
                81559,
                1643,
                37,
                12,
                (GpuProcess(479, "compute", 1634), GpuProcess(480, "compute", None), GpuProcess(900, "graphics", 3)),
            ),
            Gpu(1, "GPU-bbb", "NVIDIA H100 80GB HBM3", 81559, 0, None, None, ()),
        )
    )
    reader.close()
    reader.close()
    assert nvml.shutdowns == 1


def test_nvml_memory_v2_leaves_out_the_reserve_as_nvidia_smi_does():
    class FakeNvmlV2(FakeNvml):
        nvmlMemory_v2 = 0x02000028

        def nvmlDeviceGetMemoryInfo(self, handle, version=None):
            info = super().nvmlDeviceGetMemoryInfo(handle)
            return info if version is None else SimpleNamespace(total=info.total, used=info.used - 480 * MIB)

    (gpu, _) = GpuReader("nvml", nvml=FakeNvmlV2(DEVICES)).read().gpus
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (81559, 1163)


def test_nvml_error_during_a_read():
    nvml = FakeNvml([dict(DEVICES[1], lost=True)])
    inventory = GpuReader("nvml", nvml=nvml).read()
    assert inventory == Inventory(source="nvml", gpus=(), error="NVML read failed: GPU is lost", time=inventory.time)


def test_nvml_init_failing_falls_back_in_auto_mode(tmp_path: Path, monkeypatch):
    nvml = FakeNvml(DEVICES, init_error="Driver Not Loaded")
    env = install_fake_nvidia_smi(tmp_path, THREE)
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", env["FAKE_NVIDIA_SMI_STATE"])
    smi = str(tmp_path / "bin" / "nvidia-smi")
    inventory = GpuReader("auto", nvidia_smi=smi, nvml=nvml).read()
    assert (inventory.source, len(inventory.gpus)) == ("nvidia-smi", 3)

    monkeypatch.setenv("PATH", str(tmp_path))
    inventory = GpuReader("auto", nvml=nvml).read()
    assert inventory.source == "none"
    assert inventory.error == "no NVIDIA GPU: NVML cannot be loaded (Driver Not Loaded) and nvidia-smi is not on PATH"

    inventory = GpuReader("nvml", nvml=nvml).read()
    assert (inventory.source, inventory.error) == ("nvml", "NVML cannot be loaded (Driver Not Loaded)")
