"""One nats-server for the module's tests (each test its own experiment), and a dispatcher on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from services.dispatcher.core import Dispatcher
from tests.fixtures.nats import NatsServer
from tests.integration.dispatcher.harness import connect, dispatcher


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("jetstream")).start()
    yield server
    server.stop()


@pytest.fixture
async def core(server: NatsServer) -> AsyncIterator[Dispatcher]:
    bus = await connect(server.url)
    yield await dispatcher(bus)
    await bus.nc.drain()
