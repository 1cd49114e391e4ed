"""The spot-notice watcher against the cloud metadata emulator (AWS IMDSv2, Google Cloud, Azure):
nothing until the cloud announces the reclaim, then one call with what it said; an
unreachable metadata service is said once and asked again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.adapters.spot import SpotWatcher
from tests.emulators.cloud_metadata import CloudMetadata
from tests.fixtures.nats import free_port


@pytest.fixture
def cloud():
    cloud = CloudMetadata().start()
    yield cloud
    cloud.stop()


@pytest.mark.parametrize(
    ("provider", "said"),
    [
        ("aws", "instance-action terminate at 2026-11-26T14:30:00Z"),
        ("gcp", "the VM is being preempted"),
        ("azure", "Preempt scheduled, not before Thu, 26 Nov 2026 14:30:00 GMT"),
    ],
)
async def test_the_notice_is_seen_once_the_cloud_gives_it(cloud: CloudMetadata, provider: str, said: str) -> None:
    notices: list[str] = []

    async def on_notice(why: str) -> None:
        notices.append(why)

    watcher = asyncio.create_task(SpotWatcher(provider, cloud.url, 0.05, on_notice).run())
    await asyncio.sleep(0.4)
    assert notices == [] and not watcher.done()  # asked, again and again: no notice yet
    asked = len(cloud.asked)
    assert asked >= 3

    cloud.notice(provider)
    async with asyncio.timeout(5):
        await watcher  # it returns after its one call

    assert notices == [said]
    if provider == "aws":  # IMDSv2: one token, then every look carries it (the emulator refuses looks without)
        assert [m for m, _ in cloud.asked].count("PUT") == 1


async def test_an_unreachable_metadata_service_is_said_once_and_asked_again(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="services.adapters.spot")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    watcher = asyncio.create_task(SpotWatcher("gcp", url, 0.05, lambda why: asyncio.sleep(0)).run())
    await asyncio.sleep(0.5)
    assert not watcher.done()
    watcher.cancel()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    looks = [r for r in caplog.records if "cannot read the gcp spot notice" in r.getMessage()]
    assert len(warnings) == 1 and len(looks) >= 3, [r.getMessage() for r in caplog.records]
    assert f"cannot read the gcp spot notice at {url}" in warnings[0].getMessage()
