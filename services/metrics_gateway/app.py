"""The gateway's HTTP API: ``POST /api/v1/trials/{trialId}/metrics`` (docs/internals.md §2).

Checks run cheapest first, and nothing is published unless the whole batch passes:

    version header (400 missing, 409 other major.minor) → bearer token present (401)
    → body size (413) → body shape (400) → record count (413) → token HMAC (401)
    → every record (400, naming its index) → NATS connected (503)
    → publish all, await every ack (503 on timeout) → 200 {"accepted": n}

A request's records go out as one ``MetricBatch`` message (:mod:`contracts.metrics`; a big
one in parts of :data:`MESSAGE_BYTES`) through
:class:`~services.metrics_gateway.service.BatchPublisher`, which awaits every ack together.
Resent batches are harmless: a batch's ``Nats-Msg-Id`` names its records and JetStream drops a
repeat; records resent in another grouping are dropped by the readers (:class:`contracts.metrics.Seen`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import NamedTuple

import orjson
from fastapi import FastAPI, Request, Response, Security
from fastapi.security import HTTPBearer
from nats.errors import Error as NatsError
from prometheus_client import Counter, Histogram

from contracts import VERSION, subjects
from contracts.base import utcnow
from contracts.metrics import BATCH_KIND, batch_id
from services.common import logs, tokens
from services.common.bus import Bus
from services.common.http import health_routes
from services.metrics_gateway import openapi as spec
from services.metrics_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

VERSION_HEADER = "x-trialbus-keeper-version"
RECORD_TYPES = frozenset({"PERIODICAL", "FINAL", "REQUEST_PARAMETER"})
NOT_IN_SUBJECTS = frozenset(".*> \t\r\n")

# Prometheus metrics belong to the process-wide registry that /metrics serves, so they
# are created once per process (prometheus_client refuses a second registration).
RECORDS = Counter("trialbus_gateway_records", "Metric records accepted, by outcome", ["outcome"])
BATCHES = Counter("trialbus_gateway_batches", "Batches answered 200")
REJECTIONS = Counter("trialbus_gateway_rejections", "Requests refused, by reason", ["reason"])
METRICS_PATH = "/api/v1/trials/{trial_id}/metrics"
_METRICS_ROUTE = re.compile(r"/api/v1/trials/([^/]+)/metrics")  # as FastAPI matches METRICS_PATH
#: Documents the trial's token in the OpenAPI schema; :meth:`Intake.accept` checks it.
TRIAL_TOKEN = HTTPBearer(auto_error=False, description="the trial's token (TRIALBUS_TRIAL_TOKEN in its environment)")
PUBLISH_SECONDS = Histogram("trialbus_gateway_publish_seconds", "Seconds from a batch's first publish to its last ack")


#: Publishes ``(subject, payload, msg_id)`` messages within a timeout; returns the duplicates.
Publish = Callable[[list[tuple[str, bytes, str]], float], Awaitable[int]]


class PublishError(Exception):
    """JetStream refused a record (no stream for the subject, storage failure, …)."""


class Refused(Exception):
    """A request answered with an error status; ``reason`` labels the rejection metric."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def major_minor(version: str) -> tuple[int, int] | None:
    """``"0.1.0"`` → ``(0, 1)``; ``"2.10"`` → ``(2, 10)`` (not NNI's regex, which reads 2.1)."""
    parts = version.strip().removeprefix("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_version(announced: str | None) -> None:
    if announced is None:
        raise Refused(400, "version", "the trial keeper must announce its version in X-Trialbus-Keeper-Version")
    if major_minor(announced) != major_minor(VERSION):
        raise Refused(
            409,
            "version",
            f"trial keeper version {announced} does not match metrics gateway version {VERSION} "
            "(major.minor must be equal): run the keeper shipped with this Trialbus release",
        )


def bearer(header: str | None) -> str:
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "token", "missing trial token: send 'Authorization: Bearer <token>'")
    return token.strip()


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(413, "too_large", f"request body of {declared} bytes is over the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refused(413, "too_large", f"request body is over the limit of {limit} bytes")
    return bytes(body)


def loads(text: str | bytes) -> object:
    """JSON as NNI writes it: orjson first (fast), ``json`` for NaN / Infinity (json_tricks emits them).

    ValueError for what only ``json`` reads but cannot be published (lone surrogates, nesting past
    the recursion limit), so a record that passes never fails later."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(text)
            orjson.dumps(value)
        except (RecursionError, TypeError) as exc:
            raise ValueError(f"cannot be published: {exc}") from None
        return value


def parse_batch(body: bytes, max_records: int) -> tuple[str, int, list]:
    """``{"experimentId": str, "attempt": int, "records": [...]}`` → (experiment id, attempt, raw
    records); ``attempt`` (the trial's attempt that reports, from its keeper) defaults to 0."""
    try:
        batch = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Refused(400, "bad_request", f"request body is not JSON: {exc}") from None
    if not isinstance(batch, dict):
        raise Refused(400, "bad_request", 'request body must be {"experimentId": "...", "records": [...]}')
    experiment_id, records = batch.get("experimentId"), batch.get("records")
    if not isinstance(experiment_id, str) or not experiment_id or NOT_IN_SUBJECTS.intersection(experiment_id):
        raise Refused(400, "bad_request", "experimentId must be a non-empty id without '.', '*', '>' or spaces")
    if not isinstance(records, list):
        raise Refused(400, "bad_request", "records must be a list of NNI metric records (JSON strings)")
    attempt = batch.get("attempt", 0)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt < 2**31:
        raise Refused(400, "bad_request", "attempt must be a whole number from 0 (the trial's attempt)")
    if len(records) > max_records:
        raise Refused(413, "too_large", f"a batch of {len(records)} records is over the limit of {max_records}")
    return experiment_id, attempt, records


class Metric(NamedTuple):
    """A validated NNI metric record: what becomes a :class:`~contracts.MetricRecord`."""

    type: str
    sequence: int
    parameter_id: int | str | None
    value: str


def parse_record(raw: object, index: int, trial_id: str) -> Metric | None:
    """One NNI record → a Metric, None for REQUEST_PARAMETER; Refused(400) names the problem."""

    def bad(problem: str) -> Refused:
        return Refused(400, "bad_record", f"record {index}: {problem}")

    try:
        record = loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise bad("must be a JSON object")
    if record.get("trial_job_id") != trial_id:
        raise bad(f"trial_job_id {record.get('trial_job_id')!r} is not this trial ({trial_id!r})")
    kind, sequence, parameter_id = record.get("type"), record.get("sequence"), record.get("parameter_id")
    if kind not in RECORD_TYPES:
        raise bad(f"type {kind!r} is not one of {', '.join(sorted(RECORD_TYPES))}")
    if type(sequence) is not int or sequence < 0:
        raise bad(f"sequence {sequence!r} must be an integer >= 0")
    if kind == "REQUEST_PARAMETER":
        return None
    if parameter_id is not None and type(parameter_id) not in (int, str):
        raise bad(f"parameter_id {parameter_id!r} must be an integer, a string or null")
    if "value" not in record:
        raise bad("has no value")
    value = record["value"]
    if isinstance(value, str):
        try:
            loads(value)
        except ValueError:
            raise bad(f"value {value[:100]!r} is not JSON text") from None
    else:  # a plain JSON value: encode it the way the NNI SDK would have
        value = json.dumps(value)
    return Metric(kind, sequence, parameter_id, value)


#: Bytes of records in one METRICS message at most: a bigger batch goes out in parts, split
#: the same way each time it is sent (NATS's max_payload is 1 MiB by default).
MESSAGE_BYTES = 256 * 1024


def encode_batches(
    experiment_id: str, trial_id: str, metrics: list[Metric], timestamp: datetime, attempt: int = 0
) -> list[tuple[bytes, str]]:
    """The records as ``MetricBatch`` messages (``(payload, Nats-Msg-Id)``), in order, each
    under :data:`MESSAGE_BYTES` of values (or one record), built with orjson: exactly
    ``MetricBatch(...).encode()``, which costs 3× more through pydantic (a test holds the
    two equal). O(records)."""
    head = {
        "kind": BATCH_KIND,
        "v": 1,
        "experimentId": experiment_id,
        "trialId": trial_id,
        "attempt": attempt,
        "timestamp": timestamp,
    }
    messages: list[tuple[bytes, str]] = []
    part: list[Metric] = []
    size = 0
    for m in metrics:
        if part and size + len(m.value) > MESSAGE_BYTES:
            messages.append(_message(head, trial_id, attempt, part))
            part, size = [], 0
        part.append(m)
        size += len(m.value) + 64
    if part:
        messages.append(_message(head, trial_id, attempt, part))
    return messages


def _message(head: dict, trial_id: str, attempt: int, part: list[Metric]) -> tuple[bytes, str]:
    records = [
        {"type": m.type, "sequence": m.sequence, "value": m.value}
        if m.parameter_id is None
        else {"parameterId": m.parameter_id, "type": m.type, "sequence": m.sequence, "value": m.value}
        for m in part
    ]
    payload = orjson.dumps({**head, "records": records}, option=orjson.OPT_UTC_Z)
    return payload, batch_id(trial_id, attempt, ((m.type, m.sequence) for m in part))


class Intake:
    """The route's logic: checks, validation, publishing (see the module docstring for order)."""

    def __init__(self, settings: GatewaySettings, bus: Callable[[], Bus | None], publish: Publish) -> None:
        self.settings = settings
        self.bus = bus
        self.publish = publish

    async def accept(self, trial_id: str, request: Request) -> int:
        """The number of records accepted; raises Refused with the answer otherwise."""
        experiment_id = None
        try:
            check_version(request.headers.get(VERSION_HEADER))
            token = bearer(request.headers.get("authorization"))
            body = await read_body(request, self.settings.gateway_max_body)
            experiment_id, attempt, raw_records = parse_batch(body, self.settings.gateway_max_records)
            secret = self.settings.trial_secret.get_secret_value()
            if NOT_IN_SUBJECTS.intersection(trial_id) or not tokens.check_token(secret, experiment_id, trial_id, token):
                raise Refused(401, "token", f"wrong token for trial {trial_id} of experiment {experiment_id}")
            records = [parse_record(raw, i, trial_id) for i, raw in enumerate(raw_records)]
            metrics = [record for record in records if record is not None]
            duplicates = await self._publish(experiment_id, trial_id, attempt, metrics)
        except Refused as exc:
            REJECTIONS.labels(exc.reason).inc()
            with logs.bind(experiment=experiment_id, trial=trial_id):
                log.warning("refused a batch with %d: %s", exc.status, exc.message)
            raise
        if log.isEnabledFor(logging.DEBUG):
            with logs.bind(experiment=experiment_id, trial=trial_id):
                log.debug("accepted %d records (%d duplicates)", len(records), duplicates)
        BATCHES.inc()
        RECORDS.labels("published").inc(len(metrics) - duplicates)
        RECORDS.labels("duplicate").inc(duplicates)
        RECORDS.labels("request_parameter").inc(len(records) - len(metrics))
        return len(records)

    async def _publish(self, experiment_id: str, trial_id: str, attempt: int, metrics: list[Metric]) -> int:
        bus = self.bus()
        if bus is None or not bus.nc.is_connected:
            raise Refused(503, "unavailable", "NATS is unavailable; retry later")
        if not metrics:  # a hello or a heartbeat: the keeper is alive (services/dispatcher/liveness.py)
            try:
                await bus.nc.publish(subjects.heartbeats(experiment_id, trial_id), b'{"attempt": %d}' % attempt)
            except (NatsError, OSError) as exc:
                raise Refused(503, "unavailable", f"NATS did not take the heartbeat ({exc}); retry later") from None
            return 0
        subject = subjects.metrics(experiment_id, trial_id)
        batches = encode_batches(experiment_id, trial_id, metrics, utcnow(), attempt)
        messages = [(subject, payload, msg_id) for payload, msg_id in batches]
        started = time.perf_counter()
        try:
            duplicates = await self.publish(messages, self.settings.gateway_publish_timeout)
            if duplicates:  # a resent batch: its records were published before
                duplicates = len(metrics) if duplicates == len(messages) else duplicates
        except TimeoutError:
            raise Refused(503, "unavailable", "JetStream did not ack the batch in time; retry later") from None
        except (PublishError, NatsError, OSError) as exc:
            raise Refused(503, "unavailable", f"JetStream did not take the batch ({exc}); retry later") from None
        PUBLISH_SECONDS.observe(time.perf_counter() - started)
        return duplicates


def json_response(body: dict, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def create_app(settings: GatewaySettings, bus: Callable[[], Bus | None], publish: Publish) -> FastAPI:
    """The gateway's app: the metrics route plus ``/healthz`` and ``/metrics``."""
    app = FastAPI(title="Trialbus metrics gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(health_routes(bus))
    intake = Intake(settings, bus, publish)

    @app.post(
        METRICS_PATH,
        dependencies=[Security(TRIAL_TOKEN)],
        responses=spec.RESPONSES,
        openapi_extra=spec.batch_body(settings.gateway_max_records, RECORD_TYPES),
    )
    async def post_metrics(trial_id: str, request: Request) -> Response:
        return await answer(intake, trial_id, request)

    app.state.intake = intake
    from services.metrics_gateway.asks import ASK_PATH, AskRelay  # builds on this module's checks

    relay = AskRelay(settings, bus)

    @app.post(ASK_PATH, dependencies=[Security(TRIAL_TOKEN)], responses=spec.RESPONSES)
    async def post_ask(trial_id: str, request: Request) -> Response:
        try:
            body = await read_body(request, settings.gateway_max_ask_body)
            answer = await relay.relay(
                trial_id, request.headers.get(VERSION_HEADER), request.headers.get("authorization"), body
            )
        except Refused as exc:
            return json_response({"error": exc.message}, exc.status)
        return Response(answer, media_type="application/json")

    return app


async def answer(intake: Intake, trial_id: str, request: Request) -> Response:
    try:
        accepted = await intake.accept(trial_id, request)
    except Refused as exc:
        return json_response({"error": exc.message}, exc.status)
    return json_response({"accepted": accepted})


class MetricsRoute:
    """The ASGI app the gateway serves: ``app``, but a POST to the metrics route goes straight to
    its intake, past FastAPI's middleware, routing and dependencies (the same answer, as the
    route above gives it: a test holds them equal). Every trial's keeper posts at least once,
    and those layers cost more CPU than the intake itself."""

    def __init__(self, app: FastAPI) -> None:
        self.app, self.intake = app, app.state.intake

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and (found := _METRICS_ROUTE.fullmatch(scope["path"])):
            response = await answer(self.intake, found.group(1), Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
