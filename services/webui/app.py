"""The web UI's HTTP side: the page, its static files, a JSON API and two event streams.

Pages (one HTML shell, drawn by ``static/app.js``):

    GET  /                              the newest experiment (follows newer ones as they start)
    GET  /experiments/{id}              one experiment; 404 page naming the id if unknown
    GET  /queue                         the shared platforms' queue, by team, in order, and the teams' shares
    GET  /login?token=<token>           sets the session cookie (when an api_token is set)

API (JSON; every refusal is ``{"error": "<what to do>"}`` with a 4xx/5xx status):

    GET  /experiments                       every experiment in a table, filtered and sorted
    GET  /api/experiments                       every experiment in a row (filter, sort:
                                                :mod:`services.webui.experiments`), newest first
    GET  /api/experiments/{id}                  overview: status, counts, best, masked config
    GET  /api/experiments/{id}/trials           a window of the trials' rows: offset, limit, sort, order,
                                                status (:mod:`services.webui.queries`); O(log n + limit)
    GET  /api/experiments/{id}/chart?points=n   the overview chart: final metrics by trial number, at
                                                most n points, extremes kept (:mod:`services.webui.finals`)
    POST /api/experiments/{id}/trials           add a trial, NNI's customized one (:mod:`.addtrial`, relayed)
    GET  /api/experiments/{id}/logs[/stream]    the dispatcher's and tuner's lines about it (:mod:`.logs`)
    POST /api/experiments/{id}/stop             stop it (the dispatcher's answer, relayed)
    PATCH /api/experiments/{id}                 change its limits and search space (:mod:`.edits`)
    GET  /api/trials/{id}                       one trial's row
    GET  /api/trials/{id}/metrics[?points=n]    its metric records (history); at most n intermediate
                                                results per attempt, extremes kept, with ``points``
    GET  /api/experiments/{id}/intermediate     every trial's curve on one chart, a bounded set, and the
         /api/experiments/{id}/compare          step filter; trials side by side (:mod:`.intermediate_api`)
    GET  /api/trials/{id}/log?maxBytes=n        the tail of its log (relayed)
    POST /api/trials/{id}/cancel                cancel it (relayed)
    POST /api/trials/{id}/retry                 run it again as its next attempt, once it has ended (relayed)
    GET  /api/platforms                         adapter replicas, GPUs, machines, clusters
    GET  /api/queue                             who waits for capacity on each shared platform, in the
                                                order they get it, and why (the dispatcher's, relayed)
    GET  /api/teams                             each team's quota, weight, use and borrowed capacity
                                                (the dispatcher's, relayed)
    GET  /api/events[?experiment=id]            server-sent events (:mod:`services.webui.hub`)
    GET  /api/trials/{id}/metrics/stream        server-sent ``metrics`` events: the trial's records,
         [?points=n]                            history first, then live (``problem`` if unreadable);
                                                ``curve`` events (all of them, cut down to n per
                                                attempt) once an attempt reported more than n

Who may call is :mod:`services.common.auth` (the dispatcher's tokens and checks): everything but
``/healthz``, ``/metrics``, ``/login`` and the static files (which hold no data) needs
``Authorization: Bearer <token>`` or the cookie ``/login`` sets, and a ``Host`` of this machine.
The cookie (``SameSite=Strict``, ``HttpOnly``) holds an HMAC of the token and its role, not the
token: it opens the web UI and nothing else; the read-only token's cookie cannot cancel, retry
or stop. POSTs that a browser sends from another site (its ``Origin`` is not this host) are
refused, so a page elsewhere cannot cancel or retry trials through a browser that is logged in.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from fastapi.security import APIKeyCookie, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.people import ADMIN, READER
from contracts.state import TrialStatus
from services.common import openapi as doc
from services.common.auth import SAFE_METHODS, Access, AccessDenied, session_value
from services.common.bus import Bus
from services.common.http import health_routes
from services.webui import addtrial, analysis, curves, experiments, logs, queries
from services.webui import openapi as spec
from services.webui.actions import Dispatcher, Refused
from services.webui.edits import add_edit_routes
from services.webui.hub import KEEPALIVE, KEEPALIVE_SECONDS, Hub, followed, frame
from services.webui.intermediate import Intermediates
from services.webui.intermediate_api import routes as intermediate_routes
from services.webui.model import Model
from services.webui.openapi import CHANGE, READ, RELAYED
from services.webui.people import PREFIX as SESSION_PREFIX
from services.webui.people import People, Person
from services.webui.settings import WebuiSettings

STATIC = Path(__file__).parent / "static"
COOKIE = "trialbus_webui"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
#: Scripts, styles and connections from this origin only; no inline script, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MAX_LOG_BYTES = 4 * 1024 * 1024
#: The two ways to present the token, documented in the OpenAPI schema; ``authorize`` checks them.
CREDENTIALS = [
    Security(HTTPBearer(auto_error=False, description="TRIALBUS_API_TOKEN (or the read-only token)")),
    Security(APIKeyCookie(name=COOKIE, auto_error=False, description="the session cookie /login sets")),
]


def load_static(folder: Path = STATIC) -> dict[str, tuple[bytes, str]]:
    """Every file the page needs, read once at start: name → (bytes, media type)."""
    return {
        path.name: (path.read_bytes(), MEDIA_TYPES[path.suffix])
        for path in sorted(folder.iterdir())
        if path.is_file() and path.suffix in MEDIA_TYPES
    }


def message_page(title: str, text: str, status: int) -> HTMLResponse:
    """A small page for people (404, 401): what happened and what to do."""
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Trialbus — '
        f'{html.escape(title)}</title><link rel="stylesheet" href="/static/style.css">'
        '<link rel="icon" href="/static/favicon.svg"></head>'
        f'<body><main class="message"><h1>{html.escape(title)}</h1><p id="message">{html.escape(text)}</p>'
        '<p><a href="/">Show the newest experiment</a></p></main></body></html>'
    )
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers={"Cache-Control": "no-store"}
    )


def create_app(
    settings: WebuiSettings,
    model: Model,
    hub: Hub,
    bus: Callable[[], Bus | None],
    dispatcher: Dispatcher,
    intermediates: Intermediates | None = None,
) -> FastAPI:
    # The OpenAPI schema holds no data, so it is served without a token (as the dispatcher's); no docs pages.
    app = FastAPI(title="Trialbus web UI", docs_url=None, redoc_url=None, openapi_url="/api/openapi.json")
    app.include_router(health_routes(bus))
    static = load_static()
    token = settings.api_token.get_secret_value() if settings.api_token else None
    read_token = settings.api_read_token.get_secret_value() if settings.api_read_token else None
    access = Access(
        settings,
        hint="open /login?token=<TRIALBUS_API_TOKEN> once in this browser (`trialbus up` "
        "prints the link), or send 'Authorization: Bearer <TRIALBUS_API_TOKEN>'",
    )

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        if request.url.path.startswith("/api/"):
            headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
            return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)
        title = {401: "Log in to Trialbus", 404: "Not found"}.get(exc.status, "Refused")
        return message_page(title, exc.message, exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"nothing at {request.method} {request.url.path}: the web UI serves / and /experiments/<id>"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return await refused(request, Refused(exc.status_code, message))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return await refused(request, Refused(400, problems))

    people = People(dispatcher)

    async def authorize(request: Request) -> None:
        """Who asks (``request.state.person``), or :class:`Refused`: Host, Origin, then the
        stack's tokens (as bearer or cookie), then a person's token or session (:mod:`.people`)."""
        unsafe = request.method not in SAFE_METHODS
        try:
            access.check_host(request)
            if unsafe:
                access.check_origin(request)
        except AccessDenied as exc:
            raise Refused(exc.status, exc.message) from None
        person = await who(request)
        if unsafe and person.caller == READER:
            raise Refused(403, "the read-only token may only read: this needs TRIALBUS_API_TOKEN")
        if unsafe and person.caller.role == "viewer":
            raise Refused(403, f"{person.caller.name} is a viewer: viewers read, and may not change anything")
        request.state.person = person

    async def who(request: Request) -> Person:
        cookie = request.cookies.get(COOKIE)
        stack_cookie = None if cookie is None or cookie.startswith(SESSION_PREFIX) else cookie
        try:
            role = access.credential(request, stack_cookie)
            return Person(ADMIN if role == "full" else READER, None)
        except AccessDenied as exc:
            denied = exc
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        try:
            if scheme.lower() == "bearer" and presented.strip():
                person = await people.identify(presented.strip())
            elif cookie is not None and cookie.startswith(SESSION_PREFIX):
                person = await people.of_cookie(cookie)
            else:
                person = None
        except Refused as exc:  # the dispatcher, which knows people's tokens, cannot be asked now
            raise Refused(
                denied.status, f"{denied.message} (people's own tokens cannot be checked: {exc.message})"
            ) from None
        if person is None:
            raise Refused(denied.status, denied.message)
        return person

    async def login_person(given: str) -> Person | None:
        try:
            return await people.identify(given)
        except Refused as exc:
            raise Refused(503, f"cannot check this token now: {exc.message}") from None

    @app.get("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        try:
            access.check_host(request)
        except AccessDenied as exc:
            raise Refused(exc.status, exc.message) from None
        given = request.query_params.get("token")
        if token is None:
            return RedirectResponse("/", status_code=303)
        if not given:
            raise Refused(400, "add the API token: /login?token=<TRIALBUS_API_TOKEN> (`trialbus up` prints this link)")
        role = access.match(given)
        if role is not None:
            secret = token if role == "full" else read_token
            assert secret is not None  # match found the role by this very token
            value = session_value(secret, role)
        elif (person := await login_person(given)) is not None:
            value = people.open(person)
        else:
            raise Refused(
                401,
                "wrong token: use your own token (`trialbus user add` gave it), or the TRIALBUS_API_TOKEN "
                "(or read-only token) the stack runs with; `trialbus up` keeps it in <data>/api-token",
            )
        answer = RedirectResponse("/", status_code=303)
        answer.set_cookie(COOKIE, value, httponly=True, samesite="strict", path="/")
        return answer

    pages = APIRouter(dependencies=[Depends(authorize), *CREDENTIALS])

    def shell() -> Response:
        content, media_type = static["index.html"]
        return Response(content, media_type=media_type, headers=SECURITY_HEADERS)

    @pages.get("/", responses=spec.page(*READ))
    async def newest() -> Response:
        return shell()

    @pages.get("/experiments/{experiment_id}", responses=spec.page(*READ, 404))
    async def experiment_page(experiment_id: str) -> Response:
        if experiment_id not in model.experiments:
            raise Refused(
                404, f"there is no experiment {experiment_id!r} (it may have been removed, or the id is mistyped)"
            )
        return shell()

    @pages.get("/experiments", responses=spec.page(*READ))
    async def experiments_page() -> Response:
        return shell()

    @pages.get("/queue", responses=spec.page(*READ))
    async def queue_page() -> Response:
        return shell()

    # No data in them: open without the token, so the 401 page has its style.
    @app.get("/static/{name}", responses=spec.STATIC)
    async def static_file(name: str) -> Response:
        if name not in static:
            raise Refused(404, f"no static file {name!r}")
        content, media_type = static[name]
        return Response(content, media_type=media_type, headers=SECURITY_HEADERS)

    api = APIRouter(prefix="/api", dependencies=[Depends(authorize), *CREDENTIALS])

    def experiment_of(experiment_id: str) -> dict[str, Any]:
        overview = model.overview(experiment_id)
        if overview is None:
            raise Refused(404, f"experiment {experiment_id!r} not found")
        return overview

    def trial_of(trial_id: str) -> Any:
        trial = model.trial(trial_id)
        if trial is None:
            raise Refused(404, f"trial {trial_id!r} not found")
        return trial

    @api.get("/experiments", responses=doc.refusals(*READ), openapi_extra=experiments.QUERY)
    async def list_experiments(request: Request) -> Response:
        return json_response(experiments.listing(model, dict(request.query_params), request.state.person.caller))

    @api.get("/experiments/{experiment_id}", responses=doc.refusals(*READ, 404))
    async def get_experiment(experiment_id: str) -> Response:
        return json_response(experiment_of(experiment_id))

    @api.get(
        "/experiments/{experiment_id}/trials",
        responses=doc.refusals(*READ, 404),
        openapi_extra=spec.table_window(queries.MAX_ROWS, queries.DEFAULT_ROWS, [s.value for s in TrialStatus]),
    )
    async def list_trials(experiment_id: str, request: Request) -> Response:
        experiment_of(experiment_id)
        query = queries.table_query(dict(request.query_params))
        return json_response(
            model.window(experiment_id, query.order, query.descending, query.statuses, query.offset, query.limit)
        )

    @api.get(
        "/experiments/{experiment_id}/chart",
        responses=doc.refusals(*READ, 404),
        openapi_extra=spec.chart_points(*curves.POINTS_RANGE, "at most this many points (default 1,000)"),
    )
    async def experiment_chart(experiment_id: str, request: Request) -> Response:
        experiment_of(experiment_id)
        points = queries.points(dict(request.query_params), curves.DEFAULT_POINTS)
        return json_response(model.chart(experiment_id, points or curves.DEFAULT_POINTS))

    @api.post("/experiments/{experiment_id}/stop", responses=doc.refusals(*CHANGE, *RELAYED))
    async def stop_experiment(experiment_id: str, request: Request) -> Response:
        result = await dispatcher.stop_experiment(experiment_id, request.state.person.token)
        return json_response({"id": experiment_id, "status": (result or {}).get("status")})

    @api.get("/trials/{trial_id}", responses=doc.refusals(*READ, 404))
    async def get_trial(trial_id: str) -> Response:
        return json_response(model.row(trial_of(trial_id)))

    @api.post("/trials/{trial_id}/cancel", responses=doc.refusals(*CHANGE, *RELAYED))
    async def cancel_trial(trial_id: str, request: Request) -> Response:
        result = await dispatcher.cancel_trial(trial_id, request.state.person.token)
        return json_response({"id": trial_id, "status": (result or {}).get("status")})

    @api.post("/trials/{trial_id}/retry", responses=doc.refusals(*CHANGE, *RELAYED))
    async def retry_trial(trial_id: str, request: Request) -> Response:
        result = await dispatcher.retry_trial(trial_id, request.state.person.token) or {}
        return json_response({"id": trial_id, "status": result.get("status"), "attempt": result.get("attempt")})

    @api.get(
        "/trials/{trial_id}/log", openapi_extra=spec.log_size(MAX_LOG_BYTES), responses=doc.refusals(*READ, *RELAYED)
    )
    async def trial_log(trial_id: str, request: Request) -> Response:
        raw = request.query_params.get("maxBytes", str(64 * 1024))
        if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= MAX_LOG_BYTES:
            raise Refused(400, f"maxBytes must be a whole number of bytes from 1 to {MAX_LOG_BYTES}, not {raw!r}")
        attempt = request.query_params.get("attempt")
        if attempt is not None and not (attempt.isascii() and attempt.isdigit()):
            raise Refused(400, f"attempt must be a whole number, 0 or more (the first attempt is 0), not {attempt!r}")
        text = await dispatcher.trial_log(trial_id, int(raw), None if attempt is None else int(attempt))
        return json_response({"id": trial_id, "text": text})

    def connected() -> Bus:
        current = bus()
        if current is None or not current.nc.is_connected:
            raise Refused(503, "NATS is unavailable; retry in a moment")
        return current

    @api.get(
        "/trials/{trial_id}/metrics",
        responses=doc.refusals(*READ, 404, 503, 504),
        openapi_extra=spec.chart_points(
            *curves.POINTS_RANGE,
            "at most this many intermediate results per attempt, extremes kept (every record without it)",
        ),
    )
    async def trial_metrics(trial_id: str, request: Request) -> Response:
        trial = trial_of(trial_id)
        points = queries.points(dict(request.query_params), None)
        current = connected()
        try:
            return json_response(await curves.history(current, trial.experiment_id, trial.id, points=points))
        except TimeoutError:
            raise Refused(504, f"the METRICS stream did not deliver trial {trial_id}'s records in time") from None

    @api.get("/experiments/{experiment_id}/activity", responses=doc.refusals(*READ, 404, *RELAYED))
    async def experiment_activity(experiment_id: str, request: Request) -> Response:
        """Who changed what in the experiment, done or refused (its audit trail, newest last): the
        records the person logged in may see (their team's; an admin's: all)."""
        experiment_of(experiment_id)
        return json_response(await dispatcher.activity(experiment_id, request.state.person.token))

    @api.get("/whoami", responses=doc.refusals(*READ))
    async def whoami(request: Request) -> Response:
        """Who is logged in: ``{"name", "team", "role"}`` (the page shows it, and hides what they may not do)."""
        return json_response(request.state.person.caller.view())

    @api.get("/platforms", responses=doc.refusals(*READ))
    async def list_platforms() -> Response:
        return json_response(hub.platforms)

    @api.get("/queue", responses=doc.refusals(*READ, 502, 503))
    async def queue(request: Request) -> Response:
        """Each shared platform: ``{"platform", "capacity", "used", "waiting": [{"position",
        "experiment", "team", "priority", "gpusPerTrial", "ready", "why"}, …]}``, as the dispatcher
        ranks them (``trialbus queue``); 503 while no dispatcher answers."""
        return json_response(await dispatcher.queue(request.state.person.token))

    @api.get("/teams", responses=doc.refusals(*READ, 502, 503))
    async def teams(request: Request) -> Response:
        """Every team with a share, or using or waiting for capacity: ``{"name", "weight", "quota",
        "platforms", "configured", "use": {<platform>: {"gpus", "trials", "quota", "borrowedGpus",
        "borrowedTrials", "waitingExperiments", "capacity"}}}`` (``trialbus team list``)."""
        return json_response(await dispatcher.teams(request.state.person.token))

    def event_stream(frames: AsyncIterator[bytes]) -> StreamingResponse:
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(frames, media_type="text/event-stream", headers=headers)

    @api.get(
        "/events",
        openapi_extra=spec.EXPERIMENT_FILTER,
        responses=spec.event_stream("the live page's events (snapshot, then changes)", *READ, 404),
    )
    async def events(request: Request) -> StreamingResponse:
        experiment_id = request.query_params.get("experiment") or None
        if experiment_id is not None:
            experiment_of(experiment_id)
        stream = hub.open(experiment_id)

        async def frames() -> AsyncIterator[bytes]:
            try:
                while True:
                    try:
                        data = await asyncio.wait_for(stream.queue.get(), KEEPALIVE_SECONDS)
                    except TimeoutError:
                        yield KEEPALIVE
                        continue
                    if data is None:
                        return
                    yield data
            finally:
                hub.close_stream(stream)

        return event_stream(frames())

    @api.get(
        "/trials/{trial_id}/metrics/stream",
        openapi_extra=spec.chart_points(
            *curves.POINTS_RANGE, "at most this many intermediate results per attempt, extremes kept (default 1,000)"
        ),
        responses=spec.event_stream("the trial's metric records: history, then live", *READ, 404, 503),
    )
    async def curve_stream(trial_id: str, request: Request) -> StreamingResponse:
        trial = trial_of(trial_id)
        points = queries.points(dict(request.query_params), curves.DEFAULT_POINTS) or curves.DEFAULT_POINTS
        current = connected()
        follower = curves.CurveFollower(current, trial.experiment_id, trial.id, points)

        frames = followed(hub, follower, "METRICS", lambda _: None, lambda news: frame(*news), hub.interval)
        return event_stream(frames)

    api.include_router(intermediate_routes(model, intermediates or Intermediates()))
    api.include_router(experiments.routes(model, dispatcher, json_response))
    add_edit_routes(api, dispatcher, json_response)  # PATCH /api/experiments/{id}: edit a running experiment
    api.include_router(analysis.routes(model, json_response))  # hyper-parameters, durations
    addtrial.routes(api, experiment_of, dispatcher)
    logs.routes(api, experiment_of, bus, hub)
    app.include_router(pages)
    app.include_router(api)
    return app
