"""``python -m services.adapters.frameworkcontroller``: run the frameworkcontroller adapter service."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.adapters.frameworkcontroller.adapter import FrameworkcontrollerAdapter
from services.adapters.frameworkcontroller.settings import FrameworkcontrollerSettings
from services.adapters.service import AdapterService
from services.common.lifecycle import Service, run
from services.common.settings import ServiceSettings


def build() -> tuple[Service, ServiceSettings]:
    settings = FrameworkcontrollerSettings()
    return AdapterService(FrameworkcontrollerAdapter(settings), settings, registry=REGISTRY), settings


if __name__ == "__main__":
    run(build)
