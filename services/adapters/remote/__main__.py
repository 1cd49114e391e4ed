"""``python -m services.adapters.remote``: run the remote (SSH) adapter service."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.adapters.remote.adapter import RemoteAdapter
from services.adapters.remote.settings import RemoteSettings
from services.adapters.service import AdapterService
from services.common.lifecycle import Service, run
from services.common.settings import ServiceSettings


def build() -> tuple[Service, ServiceSettings]:
    settings = RemoteSettings()
    return AdapterService(RemoteAdapter(settings), settings, registry=REGISTRY), settings


if __name__ == "__main__":
    run(build)
