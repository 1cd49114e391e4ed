"""The REST API (``/api/v1``): JSON in camelCase, times ISO-8601 UTC, errors ``{"error": "…"}``.

Every route is a thin translation onto :class:`~services.dispatcher.core.Dispatcher`;
the NATS API (:mod:`services.dispatcher.bus_api`) calls the very same methods.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.people import Caller
from services.common import openapi as doc
from services.common import platforms
from services.common.api import ApiError
from services.common.auth import Access, AccessDenied, require_content_type
from services.common.bus import Bus
from services.common.http import health_routes
from services.dispatcher import history, updates
from services.dispatcher import openapi as spec
from services.dispatcher.core import Dispatcher
from services.dispatcher.openapi import CHANGE, CODE_TYPES, READ
from services.dispatcher.queries import PAGE_DEFAULT
from services.dispatcher.settings import DispatcherSettings

#: Documents the bearer token in the OpenAPI schema; the check itself is ``_caller`` below.
BEARER = HTTPBearer(auto_error=False, description="TRIALBUS_API_TOKEN (`trialbus up` keeps it in <data>/api-token)")


def home_page(webui_url: str | None) -> str:
    """What a browser opening the API's address gets: where the web UI is, and the API's own pages."""
    if webui_url:
        where = f'<p>The web UI is at <a id="webui" href="{html.escape(webui_url)}">{html.escape(webui_url)}</a>.</p>'
    else:
        where = (
            "<p>The web UI runs on a port of its own; this dispatcher was not told its address "
            "(<code>TRIALBUS_WEBUI_URL</code>). <code>trialbus up</code> prints it, and "
            "<code>trialbus view EXPERIMENT</code> prints an experiment's page in it.</p>"
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Trialbus API</title></head>'
        f"<body><main><h1>Trialbus API</h1>{where}"
        "<p>This address serves the REST API under <code>/api/v1</code> (a bearer token is required): "
        '<a id="docs" href="/api/docs">API docs</a>, <a href="/api/openapi.json">OpenAPI schema</a>, '
        '<a href="/healthz">health</a>.</p></main></body></html>'
    )


def _caller(request: Request) -> Caller:
    """Who is asking (every route of ``/api/v1``): the app's :class:`Access` and the users it knows."""
    access: Access = request.app.state.access
    return access.caller(request, request.app.state.identify)


#: A route's parameter for who is asking (FastAPI computes it once per request).
Asker = Annotated[Caller, Depends(_caller)]


def create_app(
    settings: DispatcherSettings, dispatcher: Callable[[], Dispatcher], bus: Callable[[], Bus | None]
) -> FastAPI:
    app = FastAPI(title="Trialbus dispatcher", version="1", docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.include_router(health_routes(bus))
    if settings.allowed_origins:  # CORS only where configured, for those origins only
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allowed_origins,
            allow_methods=["*"],
            allow_headers=["Authorization", "Content-Type"],
        )

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "; ".join(e["msg"] for e in exc.errors())}, status_code=422)

    access = Access(settings)

    @app.exception_handler(AccessDenied)
    async def denied(_: Request, exc: AccessDenied) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    app.state.access = access
    app.state.identify = lambda token: dispatcher().people.identify(token)

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    async def home(request: Request) -> HTMLResponse:
        access.check_host(request)  # as every page: a Host of this machine (DNS rebinding)
        return HTMLResponse(home_page(settings.webui_url), headers={"Cache-Control": "no-store"})

    async def body(request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes")
        return data

    async def json_body(request: Request) -> dict:
        require_content_type(request, "application/json")
        raw = await body(request, settings.api_max_body)
        try:  # as the NATS API parses: no NaN, no lone surrogate (neither can be stored), 1024 levels at most
            data = orjson.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "request body must be a JSON object")
        return data

    api = APIRouter(prefix="/api/v1", dependencies=[Depends(_caller), Security(BEARER)])

    @api.post(
        "/code",
        status_code=201,
        openapi_extra=spec.code_body,
        responses={**doc.answer(201, "stored", spec.CREATED_CODE), **doc.refusals(*CHANGE, 413, 415)},
    )
    async def put_code(request: Request) -> dict:
        require_content_type(request, *CODE_TYPES)
        archive = await body(request, settings.api_max_code)
        return {"codeRef": await dispatcher().put_code(archive)}

    @api.post(
        "/experiments",
        status_code=201,
        openapi_extra=spec.experiment_body,
        responses={**doc.answer(201, "created", spec.CREATED_EXPERIMENT), **doc.refusals(*CHANGE, 413, 415)},
    )
    async def create_experiment(request: Request, caller: Asker) -> dict:
        core = dispatcher()
        async with core.people.acting(caller, "experiment.create") as made:
            state = await core.create_experiment(await json_body(request), caller)
            made.experiment = state.id
        return {"id": state.id}

    @api.get("/experiments", responses=doc.refusals(*READ))
    async def list_experiments() -> list[dict]:
        return dispatcher().list_experiments()

    @api.get("/experiments/{experiment_id}", responses=doc.refusals(*READ, 404))
    async def get_experiment(experiment_id: str) -> dict:
        core = dispatcher()
        return core.experiment_view(core.experiment(experiment_id))

    @api.delete("/experiments/{experiment_id}", responses=doc.refusals(*CHANGE, 404))
    async def stop_experiment(experiment_id: str, caller: Asker) -> dict:
        core = dispatcher()
        async with core.people.acting(caller, "experiment.stop", experiment_id=experiment_id):
            return core.experiment_view(await core.stop_experiment(experiment_id))

    @api.post("/experiments/{experiment_id}/resume", responses=doc.refusals(*CHANGE, 404, 409))
    async def resume_experiment(experiment_id: str, caller: Asker) -> dict:
        """NNI's resume: a STOPPED experiment runs again (409 when it has nothing left to run)."""
        core = dispatcher()
        async with core.people.acting(caller, "experiment.resume", experiment_id=experiment_id):
            return core.experiment_view(await core.resume_experiment(experiment_id))

    @api.patch(
        "/experiments/{experiment_id}", openapi_extra=updates.BODY, responses=doc.refusals(*CHANGE, 404, 409, 413, 415)
    )
    async def update_experiment(experiment_id: str, request: Request, caller: Asker) -> dict:
        """Change a RUNNING (or STOPPED) experiment's trialConcurrency, maxTrialNumber, maxExperimentDuration
        or searchSpace (nnictl update), acted on at once; 422 names a bad value and changes nothing."""
        core, data = dispatcher(), await json_body(request)
        async with core.people.acting(caller, "experiment.update", experiment_id=experiment_id) as whose:
            state, changed = await core.update_experiment(experiment_id, data)
            whose.note = updates.describe(changed)
        return updates.answer(core.experiment_view(state), changed)

    @api.post("/experiments/{experiment_id}/delete", responses=doc.refusals(*CHANGE, 404, 409))
    async def delete_experiment(experiment_id: str, caller: Asker) -> dict:
        """Delete a stopped or done experiment with its trials, their events and metric records
        (nnictl experiment delete); 409 while it runs or its trials are still stopping."""
        core = dispatcher()
        async with core.people.acting(caller, "experiment.delete", experiment_id=experiment_id):
            return await core.delete_experiment(experiment_id)

    @api.post("/experiments/{experiment_id}/import", responses=doc.refusals(*CHANGE, 404, 413, 415))
    async def import_results(experiment_id: str, request: Request, caller: Asker) -> dict:
        """Import earlier results (nnictl experiment import): a JSON list of ``{"parameter", "value"}``; the
        experiment's tuner learns from them before it proposes (services/dispatcher/imports.py)."""
        require_content_type(request, "application/json")
        try:
            rows = orjson.loads(await body(request, settings.api_max_body))
        except ValueError as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}") from None
        core = dispatcher()
        async with core.people.acting(caller, "experiment.import", experiment_id=experiment_id) as whose:
            state = await core.import_results(experiment_id, rows)
            whose.note = f"imported {len(rows)} results"
            return core.experiment_view(state)

    @api.post(
        "/experiments/{experiment_id}/trials",
        status_code=201,
        openapi_extra=spec.trial_body,
        responses={
            **doc.answer(201, "submitted (WAITING)", spec.SUBMITTED_TRIAL),
            **doc.refusals(*CHANGE, 404, 409, 413, 415),
        },
    )
    async def submit_trial(experiment_id: str, request: Request, caller: Asker) -> dict:
        data = await json_body(request)
        unknown = set(data) - {"parameters", "parameterId"}
        if unknown:
            raise ApiError(422, f"unknown field(s) {', '.join(sorted(unknown))}; expected parameters and parameterId")
        if "parameters" not in data:
            raise ApiError(422, 'parameters is required, e.g. {"parameters": {"lr": 0.01}}')
        core = dispatcher()
        async with core.people.acting(caller, "trial.submit", experiment_id=experiment_id):
            trial = await core.submit_trial(experiment_id, data["parameters"], data.get("parameterId"))
        return {"id": trial.id, "sequenceId": trial.sequence_id, "status": trial.status.value}

    @api.get("/experiments/{experiment_id}/trials", responses=doc.refusals(*READ, 404))
    async def list_trials(
        experiment_id: str,
        limit: int = PAGE_DEFAULT,
        cursor: str | None = None,
        status: str | None = None,
        sort: str = "sequence",
    ) -> dict:
        """A page of the experiment's trials, ``{"trials": [...], "nextCursor": ...}``: pass
        ``nextCursor`` back as ``cursor`` for the next page (none on the last). ``status``: a
        comma-separated filter (``RUNNING,WAITING``); ``sort``: ``sequence`` (submission order)
        or ``metric`` (best final metric first, as the experiment's ``optimize_mode`` says)."""
        return dispatcher().list_trials(experiment_id, limit, cursor, status, sort)

    @api.get("/trials/{trial_id}", responses=doc.refusals(*READ, 404))
    async def get_trial(trial_id: str) -> dict:
        return dispatcher().trial(trial_id).view()

    @api.get("/trials/{trial_id}/metrics", responses=doc.refusals(*READ, 404))
    async def trial_metrics(trial_id: str) -> list[dict]:
        return await dispatcher().trial_metrics(trial_id)

    @api.post(
        "/trials/{trial_id}/cancel",
        status_code=202,
        responses={**doc.answer(202, "canceling", spec.CANCELED_TRIAL), **doc.refusals(*CHANGE, 404, 409)},
    )
    async def cancel_trial(trial_id: str, caller: Asker) -> dict:
        core = dispatcher()
        async with core.people.acting(
            caller, "trial.cancel", experiment_id=core.trial(trial_id).experiment_id, target=trial_id
        ):
            trial = await core.cancel_trial(trial_id)
        return {"id": trial.id, "status": trial.status.value}

    @api.post(
        "/trials/{trial_id}/retry",
        status_code=202,
        responses={
            **doc.answer(202, "its next attempt waits for a slot", spec.RETRIED_TRIAL),
            **doc.refusals(*CHANGE, 404, 409),
        },
    )
    async def retry_trial(trial_id: str, caller: Asker) -> dict:
        core = dispatcher()
        async with core.people.acting(
            caller, "trial.retry", experiment_id=core.trial(trial_id).experiment_id, target=trial_id
        ):
            trial = await core.retry_trial(trial_id)
        return {"id": trial.id, "status": trial.status.value, "attempt": trial.attempt}

    @api.get(
        "/trials/{trial_id}/log",
        response_class=PlainTextResponse,
        responses=doc.refusals(*READ, 404, 409, 503, why=spec.NO_ADAPTER),
    )
    async def trial_log(trial_id: str, maxBytes: int = 64 * 1024, attempt: int | None = None) -> str:  # noqa: N803
        """The tail of the trial's stdout and stderr; ``attempt`` for an earlier attempt's."""
        if not 0 < maxBytes <= 4 * 1024 * 1024:
            raise ApiError(422, "maxBytes must be between 1 and 4194304")
        if attempt is not None and attempt < 0:
            raise ApiError(422, "attempt must be 0 or more (the trial's first attempt is 0)")
        return await dispatcher().trial_log(trial_id, maxBytes, attempt)

    @api.get("/platforms", responses=doc.refusals(*READ))
    async def list_platforms() -> list[dict]:
        return [status.to_json() for status in await platforms.statuses(dispatcher().bus)]

    @api.post(
        "/platforms/{adapter}/{replica}/drain",
        responses={
            **doc.answer(200, "drained: its trials are being preempted", spec.DRAINED),
            **doc.refusals(*CHANGE, 404),
        },
    )
    async def drain_platform(adapter: str, replica: str, caller: Asker) -> dict:
        return await _drain(caller, adapter, replica, True)

    @api.post(
        "/platforms/{adapter}/{replica}/undrain",
        responses={**doc.answer(200, "taking trials again", spec.DRAINED), **doc.refusals(*CHANGE, 404)},
    )
    async def undrain_platform(adapter: str, replica: str, caller: Asker) -> dict:
        return await _drain(caller, adapter, replica, False)

    async def _drain(caller: Caller, adapter: str, replica: str, drain: bool) -> dict:
        core = dispatcher()
        async with core.people.audited(
            caller, "platform.drain" if drain else "platform.undrain", f"{adapter}/{replica}"
        ):
            if caller.role != "admin":  # a replica runs every team's trials
                raise ApiError(403, f"{caller.name} is a {caller.role}: only an admin may drain a platform's replica")
            reply = await history.drain(core.bus, adapter, replica, drain, core.settings.control_timeout)
        return {"replica": reply.replica, "draining": reply.draining, "preempted": reply.preempted}

    @api.get("/whoami", responses=doc.refusals(*READ))
    async def whoami(caller: Asker) -> dict:
        """Who the token names: ``{"name", "team", "role"}``."""
        return caller.view()

    @api.get("/users", responses=doc.refusals(*READ))
    async def list_users(caller: Asker) -> list[dict]:
        """Every user (admins only): name, team, role, when made and when their token was last replaced."""
        return dispatcher().people.users(caller)

    @api.post(
        "/users",
        status_code=201,
        openapi_extra=spec.user_body,
        responses={
            **doc.answer(201, "added: the token is shown this once", spec.ADDED_USER),
            **doc.refusals(*CHANGE, 409, 415),
        },
    )
    async def add_user(request: Request, caller: Asker) -> dict:
        """Add a user (admins only): ``{"name", "team", "role"}`` (role: admin, member or viewer;
        default member). The answer holds their token, shown once: only its hash is kept."""
        data = await json_body(request)
        unknown = set(data) - {"name", "team", "role"}
        if unknown:
            raise ApiError(422, f"unknown field(s) {', '.join(sorted(unknown))}; expected name, team and role")
        return await dispatcher().people.add(caller, data.get("name"), data.get("team"), data.get("role", "member"))

    @api.delete("/users/{name}", responses=doc.refusals(*CHANGE, 404))
    async def remove_user(name: str, caller: Asker) -> dict:
        """Remove a user (admins only): their token stops working at once."""
        return await dispatcher().people.remove(caller, name)

    @api.post(
        "/users/{name}/token",
        responses={
            **doc.answer(200, "replaced: the new token is shown this once", spec.ADDED_USER),
            **doc.refusals(*CHANGE, 404),
        },
    )
    async def rotate_token(name: str, caller: Asker) -> dict:
        """Replace a user's token (admins only): the old one stops working at once."""
        return await dispatcher().people.rotate(caller, name)

    @api.get("/audit", responses=doc.refusals(*READ))
    async def audit(
        caller: Asker, limit: int = 100, team: str | None = None, experiment: str | None = None
    ) -> list[dict]:
        """Who did what, when: the newest ``limit`` changes asked of this API (oldest first), done
        or refused; admins see every team's (or ``team``'s), others their own team's; ``experiment``:
        the changes of one experiment's work only."""
        return await dispatcher().people.audit(caller, limit, team, experiment)

    @api.get("/teams", responses=doc.refusals(*READ))
    async def list_teams(caller: Asker) -> list[dict]:
        """Every team with a share set, or running or waiting: its quota, weight, and per platform its
        use, the part of it borrowed beyond its quota, and its experiments waiting."""
        return dispatcher().teams.all()

    @api.put("/teams/{team}", openapi_extra=spec.team_body, responses=doc.refusals(*CHANGE, 415))
    async def set_team(team: str, request: Request, caller: Asker) -> dict:
        """Set a team's share (admins only): ``{"gpus", "trials", "weight", "platforms"}``; a quota
        is guaranteed, more is borrowed while idle and preempted when its owner needs it back."""
        return await dispatcher().teams.set(caller, team, await json_body(request))

    @api.delete("/teams/{team}", responses=doc.refusals(*CHANGE, 404))
    async def remove_team(team: str, caller: Asker) -> dict:
        """Forget a team's share (admins only): it is guaranteed nothing and weighs 1 again."""
        return await dispatcher().teams.remove(caller, team)

    @api.get("/queue", responses=doc.refusals(*READ))
    async def queue(caller: Asker) -> list[dict]:
        """Each shared platform's waiting experiments, in the order they get capacity, and why each waits."""
        return dispatcher().teams.queue()

    app.include_router(api)
    return app
