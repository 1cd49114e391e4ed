"""The emulator's ASGI app: discovery, the resource verbs (``api.py``), auth, the controller loop,
and the test controls under ``/emulator`` (outside the Kubernetes API, never authenticated):

- ``POST /emulator/drop-watches``: close every open watch stream (``{"dropped": n}``);
- ``POST /emulator/compact``: forget the write history (``{"resourceVersion": rv}``), so a watch
  from any older resourceVersion gets 410 Expired;
- ``GET /emulator/requests``: the API requests served so far, oldest first (``method``, ``path``,
  ``query``, ``status``; the last 10000; probes and these controls left out);
- ``POST /emulator/pods/{namespace}/{name}/fail`` ``{"reason", "message", "grace"}``: the running
  pod ends for someone else's reason (``Kubelet.fail``): failed with ``status.reason`` ``reason``
  by the kubelet or the node controller (``Evicted``, ``Preempting``, ``NodeLost``), or deleted by
  someone else when ``reason`` is null; ``grace``: seconds from SIGTERM to SIGKILL (0: every
  process dies at once; null: the pod's own). 404 when no such pod runs.

With a ``token``, every other path except ``/version``, ``/healthz``, ``/livez`` and ``/readyz``
needs ``Authorization: Bearer <token>`` and answers 401 Unauthorized without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import kueue, resources, status
from .api import Api
from .controller import TICK, Controller
from .pods import Kubelet
from .resources import FC_GROUP, FC_VERSION, FRAMEWORKS, SECRETS
from .status import ApiError
from .store import HISTORY_LIMIT, Store

PUBLIC = ("/version", "/healthz", "/livez", "/readyz")
REQUEST_LOG = 10000


@dataclass
class Settings:
    """The start options (see ``__main__`` for each one's flag)."""

    state_dir: Path
    token: str | None = None
    volumes: dict[str, str] = field(default_factory=dict)  # "nfs://<server><path>" | "azurefile://<share>" -> dir
    stuck_images: set[str] = field(default_factory=set)
    namespaces: set[str] | None = None  # None: any namespace exists
    strict: bool = False  # reject undeclared Framework fields (400) instead of pruning them
    serve_crd: bool = True
    tick: float = TICK  # seconds between controller steps
    history_limit: int = HISTORY_LIMIT  # writes a watch can resume across
    kill_grace: float = 2.0  # seconds between SIGTERM and SIGKILL, unless the pod sets its own
    kueue: bool = False  # Kueue installed (``kueue.py``)


class Gate:
    """ASGI middleware: bearer-token check and the request log (pure ASGI, so watch streams pass untouched)."""

    def __init__(self, app: ASGIApp, token: str | None, log: deque[dict[str, Any]]) -> None:
        self.app, self.token, self.log = app, token, log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        agent = dict(scope["headers"]).get(b"user-agent", b"").decode(errors="replace")
        entry: dict[str, Any] = {
            "method": scope["method"],
            "path": path,
            "query": scope["query_string"].decode(errors="replace"),
            "agent": agent,
            "status": None,
        }
        if not path.startswith("/emulator/") and path not in PUBLIC:
            self.log.append(entry)

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
            await send(message)

        if self.token and not path.startswith("/emulator/") and path not in PUBLIC:
            given = dict(scope["headers"]).get(b"authorization", b"").decode(errors="replace")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                response = JSONResponse(status.unauthorized().status(), status_code=401)
                await response(scope, receive, record)
                return
        await self.app(scope, receive, record)


def create_app(settings: Settings) -> FastAPI:
    """The emulator; its controller loop runs while the app is up and kills every pod at shutdown."""
    store = Store(settings.history_limit)
    kubelet = Kubelet(
        settings.state_dir,
        settings.volumes,
        settings.stuck_images,
        lambda namespace, name: store.get(SECRETS, namespace, name),
        settings.kill_grace,
        kueue.gate if settings.kueue else None,
    )
    controller = Controller(store, kubelet, settings.tick, kueue.Admission(store) if settings.kueue else None)
    requests: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        running = asyncio.create_task(controller.run())
        try:
            yield
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            controller.shutdown()

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.store, app.state.controller = store, controller
    _discovery(app, settings.serve_crd, settings.kueue)
    api = Api(store, kubelet, settings.namespaces, settings.strict, controller.pods)
    api.register(app, settings.serve_crd, settings.kueue)

    @app.post("/emulator/drop-watches")
    async def drop_watches() -> dict[str, int]:
        return {"dropped": store.drop_watches()}

    @app.post("/emulator/compact")
    async def compact() -> dict[str, int]:
        return {"resourceVersion": store.compact()}

    @app.post("/emulator/pods/{namespace}/{name}/fail")
    async def fail_pod(namespace: str, name: str, request: Request) -> JSONResponse:
        body = await request.json()
        pod = kubelet.running(namespace, name)
        if pod is None:
            return JSONResponse({"error": f"no pod {namespace}/{name} is running"}, status_code=404)
        grace = body.get("grace")
        kubelet.fail(pod, body.get("reason"), str(body.get("message") or ""), None if grace is None else float(grace))
        return JSONResponse({"pod": name, "uid": pod.uid})

    @app.get("/emulator/requests")
    async def request_log() -> list[dict[str, Any]]:
        return list(requests)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.status(), status_code=exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def no_route(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = status.method_not_allowed() if exc.status_code == 405 else status.no_route()
        return JSONResponse(error.status(), status_code=error.code)

    app.add_middleware(Gate, token=settings.token, log=requests)
    return app


def _discovery(app: FastAPI, serve_crd: bool, serve_kueue: bool) -> None:
    @app.get("/api")
    async def core(request: Request) -> dict[str, Any]:
        return resources.core_versions(f"{request.url.hostname}:{request.url.port}")

    @app.get("/api/v1")
    async def core_v1() -> dict[str, Any]:
        return resources.resource_list("v1", [SECRETS])

    @app.get("/apis")
    async def groups() -> dict[str, Any]:
        return resources.group_list(serve_crd, [kueue.group()] if serve_kueue else [])

    @app.get("/version")
    async def version() -> dict[str, str]:
        return resources.version_info()

    for probe in ("/healthz", "/livez", "/readyz"):
        app.add_api_route(probe, lambda: PlainTextResponse("ok"), methods=["GET"])

    if serve_kueue:

        @app.get(f"/apis/{kueue.GROUP}")
        async def kueue_group() -> dict[str, Any]:
            return kueue.group()

        @app.get(f"/apis/{kueue.GROUP}/{kueue.VERSION}")
        async def kueue_v1() -> dict[str, Any]:
            return resources.resource_list(f"{kueue.GROUP}/{kueue.VERSION}", [kueue.LOCALQUEUES, kueue.CLUSTERQUEUES])

    if serve_crd:

        @app.get(f"/apis/{FC_GROUP}")
        async def fc_group() -> dict[str, Any]:
            return resources.fc_group()

        @app.get(f"/apis/{FC_GROUP}/{FC_VERSION}")
        async def fc_v1() -> dict[str, Any]:
            return resources.resource_list(f"{FC_GROUP}/{FC_VERSION}", [FRAMEWORKS])
