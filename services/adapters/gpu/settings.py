"""GPU settings shared by the adapters that place GPUs (local-gpu, remote)."""

from __future__ import annotations

from pydantic import Field

from services.adapters.base import AdapterSettings


class GpuSettings(AdapterSettings):
    #: The ``nvidia-smi`` to run (a name on PATH or a path); on a remote machine, on its PATH.
    nvidia_smi: str = "nvidia-smi"
    #: Seconds between two reads of the GPU inventory (utilisation, foreign processes).
    gpu_refresh: float = Field(default=3.0, gt=0)
    #: Seconds a GPU trial may wait before GPUs are reserved for it, so that smaller trials
    #: cannot starve it (see ``gpu/placement.py``).
    gpu_reserve_after: float = Field(default=30.0, ge=0)
