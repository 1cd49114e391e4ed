"""``python -m services.adapters.local_gpu``: run the local-gpu adapter service."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.adapters.local_gpu.adapter import LocalGpuAdapter
from services.adapters.local_gpu.settings import LocalGpuSettings
from services.adapters.service import AdapterService
from services.common.lifecycle import Service, run
from services.common.settings import ServiceSettings


def build() -> tuple[Service, ServiceSettings]:
    settings = LocalGpuSettings()
    return AdapterService(LocalGpuAdapter(settings), settings, registry=REGISTRY), settings


if __name__ == "__main__":
    run(build)
