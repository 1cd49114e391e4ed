"""The all-curves chart's and the compare view's reads, and what feeds them from METRICS.

    GET /api/experiments/{id}/intermediate      the all-curves chart (:mod:`services.webui.intermediate`):
        [?trials=n&points=p&step=k&top=t]       the n (default 200, at most 500) trials with the best
                                                latest intermediate result, each cut down to p points
                                                (default 100); with ``step``, the t (default 20) best
                                                at step k, ranked, their curves added
    GET /api/experiments/{id}/compare           the trials' rows side by side, each with its curve:
        ?trials=a,b[&points=p]                  at most :data:`MAX_COMPARED` ids

:class:`MetricsFollower` reads the METRICS stream from its first message with one ordered
consumer on ``metrics.>`` (every experiment's), then each record as the gateway publishes it,
and hands each intermediate result with a number to :meth:`Intermediates.add`: O(log m) a
result. Reading the history at start is O(records in the stream), once, in the background.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import nats.errors
import orjson
from fastapi import APIRouter, Request, Response
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DeliverPolicy

from contracts import ContractError, MetricType, streams, subjects
from contracts.metrics import records_of
from contracts.state import default_metric
from services.common import openapi as doc
from services.common.bus import Bus
from services.webui.actions import Refused
from services.webui.intermediate import (
    DEFAULT_POINTS,
    DEFAULT_TRIALS,
    MAX_POINTS,
    MAX_TRIALS,
    Intermediates,
    curve,
)
from services.webui.model import MINIMIZE, Model
from services.webui.openapi import READ

log = logging.getLogger(__name__)

#: The most trials the compare view puts side by side.
MAX_COMPARED = 20
DEFAULT_TOP, MAX_TOP = 20, 200


class MetricsFollower:
    """Feeds :class:`Intermediates` from the METRICS stream until :meth:`stop`."""

    def __init__(self, bus: Bus, intermediates: Intermediates) -> None:
        self.bus = bus
        self.intermediates = intermediates
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.bus.js.subscribe(
            subjects.metrics(),
            stream=streams.METRICS.name,
            cb=self._on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )

    async def _on_message(self, msg: Msg) -> None:
        try:
            records = records_of(msg.data, only=MetricType.PERIODICAL)
        except ContractError:
            log.warning("skipping an unreadable metric record on %s", msg.subject)
            return
        for record in records:
            try:
                value = default_metric(record.decoded())
            except ValueError:
                continue
            if value is not None:  # a result without a number is not drawn, nor ranked
                self.intermediates.add(record.experiment_id, record.trial_id, record.attempt, record.sequence, value)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None


def _whole(params: Any, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise Refused(400, f"{name} must be a whole number from {low} to {high}, not {raw!r}")
    return int(raw)


def routes(model: Model, intermediates: Intermediates) -> APIRouter:
    """The two reads, for the web UI's ``/api`` router (which checks who asks)."""
    router = APIRouter()

    def minimize_of(experiment_id: str) -> bool:
        state = model.experiments.get(experiment_id)
        if state is None:
            raise Refused(404, f"experiment {experiment_id!r} not found")
        return state.config.optimize_mode == MINIMIZE

    @router.get("/experiments/{experiment_id}/intermediate", responses=doc.refusals(*READ, 404))
    async def all_curves(experiment_id: str, request: Request) -> Response:
        """Every trial's intermediate curve, a bounded set of them: ``{"reported", "limit", "rule",
        "optimizeMode", "step", "ranking": [{"rank", "trialId", "sequenceId", "value", "latest"}],
        "rankedOf", "curves": [{"trialId", "sequenceId", "attempt", "steps", "latest", "points"}]}``."""
        minimize = minimize_of(experiment_id)
        params = request.query_params
        limit = _whole(params, "trials", DEFAULT_TRIALS, 1, MAX_TRIALS) or DEFAULT_TRIALS
        points = _whole(params, "points", DEFAULT_POINTS, 4, MAX_POINTS) or DEFAULT_POINTS
        step = _whole(params, "step", None, 0, 10**9)
        top = _whole(params, "top", DEFAULT_TOP, 1, MAX_TOP) or DEFAULT_TOP
        body = intermediates.curves(experiment_id, minimize, limit, points, step, top)
        mode = "minimize" if minimize else "maximize"
        body["optimizeMode"] = mode
        body["rule"] = (
            f"the {min(limit, body['reported']):,} trials with the best latest intermediate result ({mode}) "
            f"of {body['reported']:,} that reported one"
        )
        for item in (*body["curves"], *body["ranking"]):
            trial = model.trial(item["trialId"])
            item["sequenceId"] = trial.sequence_id if trial is not None else None
        return json_body(body)

    @router.get("/experiments/{experiment_id}/compare", responses=doc.refusals(*READ, 404))
    async def compare(experiment_id: str, request: Request) -> Response:
        """The trials side by side: ``{"trials": [row + "curve"], "missing": [ids not found]}``,
        in the order asked; O(trials · steps of a curve)."""
        minimize_of(experiment_id)
        ids = [t for t in request.query_params.get("trials", "").split(",") if t]
        if not ids or len(ids) > MAX_COMPARED:
            raise Refused(400, f"trials must name 1 to {MAX_COMPARED} trial ids, comma-separated")
        points = _whole(request.query_params, "points", DEFAULT_POINTS, 4, MAX_POINTS) or DEFAULT_POINTS
        traces = intermediates.of(experiment_id).traces
        found, missing = [], []
        for trial_id in dict.fromkeys(ids):
            trial = model.trial(trial_id)
            if trial is None or trial.experiment_id != experiment_id:
                missing.append(trial_id)
                continue
            row = model.row(trial)
            trace = traces.get(trial_id)
            row["curve"] = curve(trial_id, trace, points) if trace is not None else None
            found.append(row)
        return json_body({"trials": found, "missing": missing})

    return router


def json_body(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json", headers={"Cache-Control": "no-store"})
