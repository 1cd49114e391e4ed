"""HTTP plumbing shared by the services that serve HTTP: health, Prometheus metrics, uvicorn.

Every HTTP service mounts :func:`health_routes` (``/healthz``, ``/metrics``) and runs its
app with :class:`HttpServer`, which leaves signal handling to the service lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.common.bus import Bus


def health_routes(bus: Callable[[], Bus | None], extra: Callable[[], dict[str, Any]] | None = None) -> APIRouter:
    """``/healthz``: 200 while connected to NATS, 503 otherwise; ``/metrics``: Prometheus text."""
    router = APIRouter()

    @router.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        current = bus()
        connected = current is not None and current.nc.is_connected
        body = {"status": "ok" if connected else "unavailable", "nats": "connected" if connected else "disconnected"}
        if extra:
            body.update(extra())
        return JSONResponse(body, status_code=200 if connected else 503)

    @router.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return router


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the service lifecycle owns signals
        yield


class HttpServer:
    """Runs a FastAPI app (or any ASGI app) in the service's event loop; ``stop`` finishes open requests."""

    def __init__(self, app: FastAPI | Callable[..., Any], host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the bind error, e.g. address in use
                raise RuntimeError("HTTP server exited during start")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        port: int = self._server.servers[0].sockets[0].getsockname()[1]  # (host, port) of a TCP socket
        return port

    def failed(self) -> BaseException | None:
        if self._task is not None and self._task.done() and not self._server.should_exit:
            return self._task.exception() or RuntimeError("HTTP server stopped")
        return None

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        await self._task
