"""``python -m services.adapters.openpai``: run the openpai adapter service."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.adapters.openpai.adapter import OpenpaiAdapter
from services.adapters.openpai.settings import OpenpaiSettings
from services.adapters.service import AdapterService
from services.common.lifecycle import Service, run
from services.common.settings import ServiceSettings


def build() -> tuple[Service, ServiceSettings]:
    settings = OpenpaiSettings()
    return AdapterService(OpenpaiAdapter(settings), settings, registry=REGISTRY), settings


if __name__ == "__main__":
    run(build)
