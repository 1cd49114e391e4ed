"""The web UI as a :class:`~services.common.lifecycle.Service`.

Start: watch the KV buckets until the model holds their current values, start pushing
changes (the hub) and reading platform status, then serve HTTP. Stop: end every browser's
event stream (uvicorn waits for open responses), stop HTTP, then the watches; the
lifecycle drains the bus last.
"""

from __future__ import annotations

import asyncio
import logging

from services.common.auth import bind_host
from services.common.bus import Bus
from services.common.http import HttpServer
from services.common.lifecycle import Service
from services.common.tasks import cancel_and_wait, first_failure
from services.webui.actions import Dispatcher
from services.webui.app import create_app
from services.webui.feed import Feed, poll_platforms
from services.webui.hub import Hub
from services.webui.intermediate import Intermediates
from services.webui.intermediate_api import MetricsFollower
from services.webui.model import Model
from services.webui.settings import WebuiSettings

log = logging.getLogger(__name__)


class WebuiService(Service):
    name = "webui"

    def __init__(self, settings: WebuiSettings) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.model = Model()
        self.hub = Hub(self.model, settings.webui_batch_interval)
        self.feed: Feed | None = None
        #: Every trial's intermediate results, from METRICS (the all-curves chart, compare).
        self.intermediates = Intermediates()
        self.model.on_deleted.append(self.intermediates.forget)
        self.metrics: MetricsFollower | None = None
        self.http: HttpServer | None = None
        self._tasks: list[asyncio.Task] = []

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.feed = Feed(bus, self.model)
        await self.feed.start()
        self.metrics = MetricsFollower(bus, self.intermediates)
        await self.metrics.start()
        platforms = poll_platforms(bus, self.hub.set_platforms, self.settings.webui_platform_interval)
        self._tasks = [
            asyncio.create_task(self.hub.run(), name="webui-hub"),
            asyncio.create_task(platforms, name="webui-platforms"),
        ]
        dispatcher = Dispatcher(lambda: self.bus, self.settings.webui_request_timeout)
        app = create_app(self.settings, self.model, self.hub, lambda: self.bus, dispatcher, self.intermediates)
        host = bind_host(self.settings, self.settings.webui_host, "the web UI")
        self.http = HttpServer(app, host, self.settings.webui_port)
        await self.http.start()
        secured = "bearer token or /login cookie" if self.settings.api_token else "no token"
        log.info("web UI on http://%s:%d/ (%s)", host, self.http.port, secured)

    @property
    def port(self) -> int:
        """The bound port (useful with ``webui_port = 0``)."""
        assert self.http is not None, "not started"
        return self.http.port

    def failed(self) -> BaseException | None:
        if self.http and (exc := self.http.failed()):
            return exc
        if self.feed and (exc := self.feed.failed()):
            return exc
        return first_failure(self._tasks)

    async def stop(self) -> None:
        self.hub.close()
        if self.http:
            await self.http.stop()
        await cancel_and_wait(self._tasks)
        await self.hub.cleaned_up()
        if self.feed:
            await self.feed.stop()
        if self.metrics:
            await self.metrics.stop()
