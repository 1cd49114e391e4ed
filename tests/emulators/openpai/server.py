"""The OpenPAI rest-server v2 API as a FastAPI app (reference: platform-apis.md, part A).

Every route is served under ``/api/v2`` and under ``/rest-server/api/v2`` (a cluster puts the
rest-server behind nginx at ``/rest-server``). A submission is checked in the server's order:
401, 429, body type, YAML (500 without ``code``), schema (400 InvalidProtocolError, message =
JSON array of AJV errors), reference checks, ``<% %>`` rendering, 409 on ``user~name`` (finished
jobs keep their names), 403 on the virtual cluster, 404 on a storage, then 202.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import yaml
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .auth import ApiError, Auth, Caller
from .jobs import JobRoutes
from .protocol import schema_errors
from .render import TemplateError, entrypoints, js_str, load_yaml, semantic_error
from .runner import Runner

PREFIXES = ("", "/rest-server")
RATE_LIMIT_WINDOW = 3600.0
RATE_LIMIT_TEXT = "Too many requests, please try again later."


@dataclass
class Settings:
    """What the CLI configures (see ``__main__``)."""

    state_dir: Path
    users: dict[str, str] = field(default_factory=lambda: {"alice": "alice-password"})
    admins: set[str] = field(default_factory=set)
    vcs: dict[str, list[str]] = field(default_factory=dict)  # beyond ``default``, which is open to all unless listed
    #: GPUs of each virtual cluster (``resourcesTotal``; unset: 0); one not in ``vcs`` is added, open to all.
    vc_gpus: dict[str, int] = field(default_factory=dict)
    storages: list[str] = field(default_factory=lambda: ["confignfs"])
    submit_limit: int = 60
    submit_window: float = RATE_LIMIT_WINDOW  # seconds the limit counts over (an hour, as upstream)
    mounts: dict[str, str] = field(default_factory=dict)  # container path -> local path
    lag: float = 0.0


def make_mounts(mounts: dict[str, str]) -> list[Path]:
    """Make each container path a symlink to its local path; returns the links this call created."""
    created = []
    for container, local in mounts.items():
        target, link = Path(local).resolve(), Path(container)
        target.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() == target:
            continue
        if link.exists() or link.is_symlink():
            raise SystemExit(f"--mount: {link} exists and is not a link to {target}")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
        created.append(link)
    return created


@dataclass
class Faults:
    """What goes wrong on purpose, set by tests through ``POST /emulator/faults`` (outside the
    rest-server's API): the next ``job_list_errors`` job lists answer 500, as when the
    rest-server loses its database, and the jobs in ``unknown`` (``user~name``) show the state
    UNKNOWN, as when the framework controller has lost track of them."""

    job_list_errors: int = 0
    unknown: set[str] = field(default_factory=set)


class Emulator:
    """State shared by the routes: users and tokens, jobs, the submission rate limiter."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.faults = Faults()
        self.auth = Auth(dict(settings.users), set(settings.admins))
        self.runner = Runner(settings.state_dir, settings.lag)
        self.vcs: dict[str, list[str] | None] = {"default": None, **settings.vcs}
        self.vcs |= {vc: None for vc in settings.vc_gpus if vc not in self.vcs}
        self._submits: dict[str, deque[float]] = defaultdict(deque)

    def caller(self, request: Request, allow_application: bool = True) -> Caller:
        return self.auth.check(request.headers.get("authorization"), allow_application)

    def rate_limited(self, user: str) -> Response | None:
        """express-rate-limit: every authenticated submission counts, failed ones included."""
        window, now, limit = self._submits[user], time.monotonic(), self.settings.submit_limit
        while window and window[0] <= now - self.settings.submit_window:
            window.popleft()
        headers = {"X-RateLimit-Limit": str(limit), "X-RateLimit-Remaining": str(max(0, limit - len(window) - 1))}
        if len(window) >= limit:
            retry = max(1, int(window[0] + self.settings.submit_window - now))
            headers |= {"X-RateLimit-Remaining": "0", "Retry-After": str(retry)}
            return PlainTextResponse(RATE_LIMIT_TEXT, status_code=429, headers=headers)
        window.append(now)
        return None

    def may_use(self, caller: Caller, vc: str) -> bool:
        if caller.admin:
            return vc in self.vcs
        return vc in self.vcs and (self.vcs[vc] is None or caller.user in self.vcs[vc])  # type: ignore[operator]

    async def submit(self, request: Request) -> Response:
        caller = self.caller(request)
        limited = self.rate_limited(caller.user)
        if limited is not None:
            return limited
        content_type = request.headers.get("content-type", "").lower()
        # Express' text parser takes only text/*; any other body becomes an object, which js-yaml reads as a string.
        body = await request.body()
        text = body.decode(errors="replace") if content_type.startswith("text/") else "[object Object]"
        try:
            job = load_yaml(text)
        except yaml.YAMLError as exc:
            return JSONResponse({"message": str(exc)}, status_code=500)
        errors = schema_errors(job)
        if errors:
            raise ApiError(400, "InvalidProtocolError", json.dumps(errors))
        problem = semantic_error(job)
        if problem:
            raise ApiError(400, "InvalidProtocolError", problem)
        try:
            commands = entrypoints(job)
        except TemplateError as exc:
            raise ApiError(500, "UnknownError", str(exc)) from None
        name = job["name"]
        framework_name = f"{caller.user}~{name}"
        if framework_name in self.runner.jobs:
            raise ApiError(409, "ConflictJobError", f"Job {framework_name} already exists.")
        vc = (job.get("defaults") or {}).get("virtualCluster")
        vc = "default" if vc is None else js_str(vc)
        if not self.may_use(caller, vc):
            raise ApiError(403, "ForbiddenUserError", f"User {caller.user} is not allowed to do operation in {vc}")
        for storage in _storage_names(job.get("extras") or {}):
            if storage not in self.settings.storages:
                raise ApiError(404, "NoStorageError", f"Storage {storage} is not found.")
        self.runner.submit(caller.user, name, vc, job, commands)
        message = f"Update job {name} for user {caller.user} successfully."
        return JSONResponse({"status": 202, "message": message}, status_code=202)


def _storage_names(extras: dict[str, Any]) -> list[str]:
    names = [s.get("name") for s in extras.get("storages") or [] if isinstance(s, dict) and s.get("name")]
    for plugin in extras.get("com.microsoft.pai.runtimeplugin") or []:
        if isinstance(plugin, dict) and plugin.get("plugin") == "teamwise_storage":
            names += (plugin.get("parameters") or {}).get("storageConfigNames") or []
    return [str(n) for n in names]


async def _login_fields(request: Request) -> dict[str, Any]:
    body = await request.body()
    if "json" in request.headers.get("content-type", ""):
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            raise ApiError(400, "InvalidParametersError", "Unexpected token in JSON") from None
        return data if isinstance(data, dict) else {}
    return {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items()}


def _routes(emu: Emulator) -> APIRouter:
    router = APIRouter(prefix="/api/v2")
    auth = emu.auth

    @router.get("/info")
    async def info() -> dict[str, str]:
        return {"name": "PAI RESTful API", "version": "v1.8.0", "launcherType": "k8s", "authnMethod": "basic"}

    @router.post("/authn/basic/login")
    async def login(request: Request) -> dict[str, Any]:
        fields = await _login_fields(request)
        return auth.login(fields.get("username"), fields.get("password"), fields.get("expiration"))

    @router.delete("/authn/basic/logout")
    async def logout(request: Request) -> dict[str, str]:
        caller = emu.caller(request, allow_application=False)
        auth.revoke(caller, caller.token)
        return {"message": "logout successfully"}

    @router.post("/tokens/application")
    async def application_token(request: Request) -> dict[str, Any]:
        caller = emu.caller(request, allow_application=False)
        return {"token": auth.issue(caller.user, application=True), "application": True}

    @router.get("/tokens")
    async def tokens(request: Request) -> dict[str, Any]:
        caller = emu.caller(request, allow_application=False)
        return {"tokens": auth.tokens_of(caller.user)}

    @router.delete("/tokens/{token}")
    async def revoke(token: str, request: Request) -> dict[str, str]:
        auth.revoke(emu.caller(request, allow_application=False), token)
        return {"message": "revoke successfully"}

    @router.get("/virtual-clusters")
    async def virtual_clusters(request: Request) -> dict[str, Any]:
        emu.caller(request)
        share = round(100 / len(emu.vcs), 2)
        zero = {"cpu": 0, "vCores": 0, "memory": 0, "gpu": 0, "GPUs": 0}
        gpus = emu.settings.vc_gpus
        return {
            vc: {
                "capacity": share,
                "usedCapacity": 0,
                "maxCapacity": share,
                "dedicated": False,
                "resourcesUsed": zero,
                "resourcesGuaranteed": zero,
                "resourcesTotal": zero | {"gpu": gpus.get(vc, 0), "GPUs": gpus.get(vc, 0)},
                "status": "RUNNING",
            }
            for vc in emu.vcs
        }

    @router.get("/storages")
    async def storages(request: Request) -> dict[str, Any]:
        emu.caller(request)
        names = emu.settings.storages
        return {
            "storages": [{"name": n, "share": True, "volumeName": n, "default": i == 0} for i, n in enumerate(names)]
        }

    @router.post("/jobs")
    async def submit(request: Request) -> Response:
        return await emu.submit(request)

    JobRoutes(emu).register(router)
    return router


def create_app(settings: Settings) -> FastAPI:
    """The emulator's ASGI app; the controller loop runs while the app is up."""
    emu = Emulator(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        links = make_mounts(settings.mounts)
        loop = asyncio.create_task(emu.runner.run())
        try:
            yield
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
            emu.runner.shutdown()
            for link in links:
                link.unlink(missing_ok=True)

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.emulator = emu
    router = _routes(emu)
    for prefix in PREFIXES:
        app.include_router(router, prefix=prefix)
        app.add_api_route(f"{prefix}/log-manager/{{path:path}}", JobRoutes(emu).log_file, methods=["GET"])

    @app.post("/emulator/faults")
    async def faults(request: Request) -> dict[str, Any]:
        body = await request.json()
        emu.faults = Faults(int(body.get("jobListErrors", 0)), set(body.get("unknownJobs", [])))
        return {"jobListErrors": emu.faults.job_list_errors, "unknownJobs": sorted(emu.faults.unknown)}

    @app.post("/emulator/jobs/{framework_name}/fail")
    async def fail_task(framework_name: str, request: Request) -> JSONResponse:
        """A running task of the job ends for a reason of the platform (``Runner.fail``)."""
        body = await request.json()
        job = emu.runner.jobs.get(framework_name)
        role, index, code = str(body.get("role", "taskrole")), int(body.get("index", 0)), int(body["code"])
        if job is None or not emu.runner.fail(job, role, index, code):
            return JSONResponse({"error": f"no task {role}/{index} of {framework_name} is running"}, status_code=404)
        return JSONResponse({"job": framework_name, "role": role, "index": index, "code": code})

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"code": exc.code, "message": exc.message}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def no_api(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Express answers an unknown route, or a known one with another method, with NoApiError.
        url = str(request.url.path).removeprefix("/rest-server")
        url += f"?{request.url.query}" if request.url.query else ""
        return JSONResponse({"code": "NoApiError", "message": f"API {url} is not found."}, status_code=404)

    return app
