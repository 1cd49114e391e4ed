"""``python -m services.adapters.fake``: the in-memory adapter as a service (no process per trial).

For benchmarks and trying the stack at scale: it takes the requests of the platform named
``TRIALBUS_FAKE_PLATFORM`` (``local-gpu`` by default, so that an experiment with
``platform: local`` runs on it), runs up to ``TRIALBUS_FAKE_CAPACITY`` trials at once (1000),
each for its parameters' ``duration`` seconds (0 by default), ending with their ``exitCode``.
It reports no metrics and forgets each trial once its end is reported.
"""

from __future__ import annotations

from prometheus_client import REGISTRY
from pydantic import Field

from services.adapters.base import AdapterSettings
from services.adapters.fake.adapter import FakeAdapter, FakePlatform
from services.adapters.service import AdapterService
from services.common.lifecycle import Service, run
from services.common.settings import ServiceSettings


class FakeSettings(AdapterSettings):
    #: The platform it stands in for: its dispatch subject, its events' source.
    fake_platform: str = "local-gpu"
    #: Trials it runs at once.
    fake_capacity: int = Field(default=1000, gt=0)


def build() -> tuple[Service, ServiceSettings]:
    settings = FakeSettings()
    adapter = FakeAdapter(FakePlatform(capacity=settings.fake_capacity), name=settings.fake_platform, forget=True)
    return AdapterService(adapter, settings, registry=REGISTRY), settings


if __name__ == "__main__":
    run(build)
