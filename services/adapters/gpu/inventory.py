"""The GPUs of a host: devices, memory, utilisation and the processes on them.

Sources, in order (``auto``): NVML through ``pynvml`` (initialised once and kept), else
``nvidia-smi -q -x`` run as a subprocess, else none (zero GPUs and an ``error`` saying why).
Reads block (NVML calls, a subprocess): call :meth:`GpuReader.read` from a thread.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Literal

ProcessType = Literal["compute", "graphics"]
Source = Literal["nvml", "nvidia-smi", "none"]
#: What a reader is told to read: a source, or ``auto`` (the first that works).
ReaderSource = Literal["auto", "nvml", "nvidia-smi", "none"]

_MIB = 2**20


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    type: ProcessType
    used_memory_mib: int | None  # None when unknown


@dataclass(frozen=True)
class Gpu:
    index: int  # as nvidia-smi numbers them
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    gpu_util: int | None  # percent, None when N/A
    memory_util: int | None  # percent, None when N/A
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class Inventory:
    source: Source
    gpus: tuple[Gpu, ...] = ()
    error: str | None = None  # why there are no GPUs, or why the last read failed
    time: float = field(default_factory=time.time)
    #: Another host's inventory: the session of each process pid there (None: not visible).
    #: None for this host's, whose sessions the scheduler looks up itself.
    sessions: dict[int, int | None] | None = None


# -- nvidia-smi -q -x -------------------------------------------------------------------------


def _number(text: str | None) -> int | None:
    """``"81559 MiB"``, ``"37 %"``, ``"479"`` → int; ``"N/A"``, ``"[Not Supported]"``, missing → None."""
    parts = (text or "").split()
    return int(parts[0]) if parts and parts[0].isdigit() else None


def _required(gpu: ET.Element, index: int, path: str) -> str:
    text = gpu.findtext(path)
    if text is None or not text.strip():
        raise ValueError(f"nvidia-smi XML: <gpu> #{index} has no <{path}>")
    return text.strip()


def _required_mib(gpu: ET.Element, index: int, path: str) -> int:
    value = _number(_required(gpu, index, path))
    if value is None:
        raise ValueError(f"nvidia-smi XML: <gpu> #{index} <{path}> is {gpu.findtext(path)!r}, not a number of MiB")
    return value


def _parse_process(info: ET.Element, index: int) -> GpuProcess:
    pid = _number(info.findtext("pid"))
    if pid is None:
        raise ValueError(f"nvidia-smi XML: a <process_info> of <gpu> #{index} has no numeric <pid>")
    kind = (info.findtext("type") or "").strip()
    return GpuProcess(
        pid=pid,
        type="graphics" if kind == "G" else "compute",  # "C", "C+G", "M", "M+C"… run compute work
        used_memory_mib=_number(info.findtext("used_memory")),
    )


def parse_nvidia_smi_xml(text: str) -> tuple[Gpu, ...]:
    """The GPUs in ``nvidia-smi -q -x`` output, in document order.

    Raises ValueError with a clear message on XML that is not nvidia-smi's."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi output is not XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi XML: the root element is <{root.tag}>, expected <nvidia_smi_log>")
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        gpus.append(
            Gpu(
                index=index,
                uuid=_required(gpu, index, "uuid"),
                name=_required(gpu, index, "product_name"),
                memory_total_mib=_required_mib(gpu, index, "fb_memory_usage/total"),
                memory_used_mib=_required_mib(gpu, index, "fb_memory_usage/used"),
                gpu_util=_number(gpu.findtext("utilization/gpu_util")),
                memory_util=_number(gpu.findtext("utilization/memory_util")),
                processes=tuple(_parse_process(p, index) for p in gpu.findall("processes/process_info")),
            )
        )
    return tuple(gpus)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- the reader -------------------------------------------------------------------------------


class GpuReader:
    """Reads the inventory; keeps NVML initialised between reads. Blocking: call from a thread.

    ``nvml`` replaces the ``pynvml`` module (default: imported on first use)."""

    def __init__(
        self,
        source: ReaderSource = "auto",
        nvidia_smi: str = "nvidia-smi",
        timeout: float = 10.0,
        nvml: Any = None,
    ) -> None:
        if source not in ("auto", "nvml", "nvidia-smi", "none"):
            raise ValueError(f"unknown GPU source {source!r}: expected auto, nvml, nvidia-smi or none")
        self.source = source
        self.nvidia_smi = nvidia_smi
        self.timeout = timeout
        self._nvml = nvml
        self._nvml_up = False
        self._lock = threading.Lock()
        # auto: the source chosen on the first read, and why there is none.
        self._chosen: Source | None = None if source == "auto" else source
        self._none_error = "GPU inventory disabled (gpu_source=none)"

    def read(self) -> Inventory:
        """The GPUs now. Never raises: a failure is an Inventory without GPUs and with an ``error``."""
        with self._lock:
            source: Source = self._chosen or "none"
            try:
                if self._chosen is None:
                    self._choose()
                source = self._chosen or "none"
                if source == "nvml":
                    return self._read_nvml()
                if source == "nvidia-smi":
                    return self._read_nvidia_smi()
                return Inventory(source="none", error=self._none_error)
            except Exception as exc:  # read() never raises
                return Inventory(source=source, error=f"GPU inventory failed: {exc!r}")

    def close(self) -> None:
        """Shut NVML down if it was initialised (a later read initialises it again)."""
        with self._lock:
            if self._nvml_up:
                self._nvml_up = False
                with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
                    self._nvml.nvmlShutdown()

    def __enter__(self) -> GpuReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- choosing ------------------------------------------------------------------------------

    def _choose(self) -> None:
        nvml_error = self._init_nvml()
        if nvml_error is None:
            self._chosen = "nvml"
        elif self._find_nvidia_smi() is not None:
            self._chosen = "nvidia-smi"
        else:
            self._chosen = "none"
            self._none_error = f"no NVIDIA GPU: NVML cannot be loaded ({nvml_error}) and {self._smi_missing()}"

    def _init_nvml(self) -> str | None:
        """Initialise NVML unless it is; None when it is up, else why not."""
        if self._nvml_up:
            return None
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                return f"pynvml is not installed: {exc}"
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
        except (self._nvml.NVMLError, OSError) as exc:
            return str(exc) or type(exc).__name__
        self._nvml_up = True
        return None

    def _find_nvidia_smi(self) -> str | None:
        found = shutil.which(self.nvidia_smi)
        if found is None and os.sep in self.nvidia_smi and os.path.exists(self.nvidia_smi):
            found = self.nvidia_smi
        return found

    def _smi_missing(self) -> str:
        if os.sep in self.nvidia_smi:
            return f"{self.nvidia_smi} does not exist or is not executable"
        return f"{self.nvidia_smi} is not on PATH"

    # -- NVML ----------------------------------------------------------------------------------

    def _read_nvml(self) -> Inventory:
        init_error = self._init_nvml()
        if init_error is not None:
            return Inventory(source="nvml", error=f"NVML cannot be loaded ({init_error})")
        nvml = self._nvml
        try:
            gpus = tuple(self._nvml_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount()))
        except nvml.NVMLError as exc:
            return Inventory(source="nvml", error=f"NVML read failed: {exc}")
        return Inventory(source="nvml", gpus=gpus)

    @staticmethod
    def _nvml_gpu(nvml: Any, index: int) -> Gpu:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = _nvml_memory(nvml, handle)
        gpu_util: int | None
        memory_util: int | None
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            gpu_util, memory_util = int(rates.gpu), int(rates.memory)
        except nvml.NVMLError:
            gpu_util = memory_util = None
        processes: dict[int, GpuProcess] = {}
        kinds: tuple[tuple[ProcessType, Any], ...] = (
            ("compute", nvml.nvmlDeviceGetComputeRunningProcesses(handle)),
            ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)),
        )
        for kind, procs in kinds:
            for proc in procs:
                used = None if proc.usedGpuMemory is None else int(proc.usedGpuMemory) // _MIB
                pid = int(proc.pid)
                seen = processes.get(pid)
                if seen is None:
                    processes[pid] = GpuProcess(pid=pid, type=kind, used_memory_mib=used)
                elif seen.used_memory_mib is None and used is not None:  # in both lists: one compute entry
                    processes[pid] = GpuProcess(pid=pid, type=seen.type, used_memory_mib=used)
        return Gpu(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mib=int(memory.total) // _MIB,
            memory_used_mib=int(memory.used) // _MIB,
            gpu_util=gpu_util,
            memory_util=memory_util,
            processes=tuple(processes.values()),
        )

    # -- nvidia-smi ----------------------------------------------------------------------------

    def _read_nvidia_smi(self) -> Inventory:
        path = self._find_nvidia_smi()
        if path is None:
            return Inventory(source="nvidia-smi", error=f"cannot run nvidia-smi: {self._smi_missing()}")
        argv = [path, "-q", "-x"]
        command = shlex.join(argv)
        pipe = subprocess.PIPE
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, text=True, errors="replace"
            )
        except OSError as exc:
            return Inventory(source="nvidia-smi", error=f"cannot run {command}: {exc}")
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # one stuck in the driver cannot be reaped
                proc.communicate(timeout=1.0)
            return Inventory(source="nvidia-smi", error=f"{command} timed out after {self.timeout:g} s")
        if proc.returncode != 0:
            why = _last_line(stderr) or _last_line(stdout) or "no output"
            return Inventory(source="nvidia-smi", error=f"{command} exited with status {proc.returncode}: {why}")
        try:
            gpus = parse_nvidia_smi_xml(stdout)
        except ValueError as exc:
            tail = _last_line(stderr)
            return Inventory(source="nvidia-smi", error=f"{command}: {exc}" + (f" (stderr: {tail})" if tail else ""))
        return Inventory(source="nvidia-smi", gpus=gpus)


def _nvml_memory(nvml: Any, handle: Any) -> Any:
    """Memory info v2 where the library and driver have it: ``used`` without the driver's reserve, as nvidia-smi."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        with contextlib.suppress(nvml.NVMLError):
            return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
    return nvml.nvmlDeviceGetMemoryInfo(handle)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
