"""The metrics gateway as a :class:`~services.common.lifecycle.Service`.

Start: serve HTTP once the bus is connected (the lifecycle bootstraps the METRICS stream
first). Stop: uvicorn stops accepting and finishes open requests, which still await
their acks; then the lifecycle drains the bus.
"""

from __future__ import annotations

import logging

from services.common.bus import Bus
from services.common.http import HttpServer
from services.common.lifecycle import Service
from services.metrics_gateway.app import create_app
from services.metrics_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


class GatewayService(Service):
    name = "metrics-gateway"

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.http: HttpServer | None = None

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.http = HttpServer(create_app(self.settings, lambda: self.bus), self.settings.gateway_host,
                               self.settings.gateway_port)
        await self.http.start()
        log.info("metrics gateway on http://%s:%d/api/v1/trials/{trialId}/metrics", self.settings.gateway_host,
                 self.http.port)

    @property
    def port(self) -> int:
        """The bound port (useful with ``gateway_port = 0``)."""
        assert self.http is not None, "not started"
        return self.http.port

    def failed(self) -> BaseException | None:
        return self.http.failed() if self.http else None

    async def stop(self) -> None:
        if self.http:
            await self.http.stop()
