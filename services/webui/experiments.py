"""The "All experiments" page's reads and actions: every experiment in a row, filtered and
sorted, and stop's siblings (resume, delete, export) relayed as the person logged in.

``GET /api/experiments`` answers one row per experiment (newest first without a ``sort``):
the keys of the experiment picker (``id``, ``name``, ``status``, ``startTime``, ``platform``)
and ``platforms``, ``owner``, ``team``, ``endTime``, ``duration`` (seconds run, time stopped
left out), ``best`` (the best final default metric, or null) with ``bestTrial``,
``optimizeMode``, ``trialCount``, ``trialCounts`` (by status) and ``mayChange`` (whether the
person may stop, resume or delete it: :func:`contracts.people.may_act`, which the dispatcher
applies again). Query parameters (all optional, as the page keeps them in its URL):

    q         text in the name or the id (case-insensitive)
    status    experiment statuses, comma-separated (``RUNNING,STOPPED``)
    platform  experiments that may run on this platform (``local``; one of a hybrid's)
    team      the owner's team
    sort      one of :data:`SORTS` (default ``start``)
    order     ``asc`` or ``desc`` (default ``desc``); experiments without a best metric stay last

Cost: the counts and the best come from the model's per-experiment index, kept as trials change
(O(log n) per trial change, :mod:`services.common.trial_index`), and are read in O(statuses)
per experiment: a request is O(E · statuses + E log E) for E experiments, whatever their trials.
Only the export reads every trial of one experiment (O(n log n), asked for a download).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from contracts.base import utcnow
from contracts.people import Caller, may_act
from contracts.state import ExperimentState, ExperimentStatus, default_metric
from services.common import export
from services.common import openapi as doc
from services.webui.actions import Dispatcher, Refused
from services.webui.model import Model
from services.webui.openapi import CHANGE, READ, RELAYED

#: The columns a list sorts by: each row's key for it.
SORTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "name": lambda r: (r["name"] or "").casefold(),
    "id": lambda r: r["id"],
    "status": lambda r: r["status"],
    "platform": lambda r: r["platform"],
    "owner": lambda r: (r["team"] or "", r["owner"] or ""),
    "start": lambda r: r["startTime"],
    "duration": lambda r: r["duration"],
    "best": lambda r: r["best"],
    "trials": lambda r: r["trialCount"],
}
#: The list's query parameters, for its OpenAPI declaration (``make fuzz`` drives them).
QUERY = doc.parameters(
    doc.parameter("q", "query", {"type": "string"}, "text in the name or the id (case-insensitive)"),
    doc.parameter(
        "status",
        "query",
        {"type": "string", "pattern": "^(RUNNING|DONE|STOPPED)(,(RUNNING|DONE|STOPPED))*$"},
        "only these experiment statuses, comma-separated",
    ),
    doc.parameter("platform", "query", {"type": "string"}, "experiments that may run on this platform"),
    doc.parameter("team", "query", {"type": "string"}, "experiments of this team"),
    doc.parameter("sort", "query", {"type": "string", "enum": list(SORTS), "default": "start"}, "the column"),
    doc.parameter(
        "order", "query", {"type": "string", "enum": ["asc", "desc"], "default": "desc"}, "ascending or descending"
    ),
)
FORMATS = {"json": ("application/json", export.as_json), "csv": ("text/csv; charset=utf-8", export.as_csv)}


def row(model: Model, state: ExperimentState, caller: Caller) -> dict[str, Any]:
    """One experiment's row: O(statuses) (counts and best from its index)."""
    config = state.config
    counts = model.counts(state.id)
    best = model.best(state.id)
    return {
        "id": state.id,
        "name": config.experiment_name,
        "status": state.status.value,
        "startTime": state.start_time.isoformat(),
        "endTime": state.end_time.isoformat() if state.end_time else None,
        "platform": config.platform,
        "platforms": [service.platform for service in config.training_services],
        "owner": state.owner,
        "team": state.team,
        "duration": max(0.0, state.run_time(utcnow()).total_seconds()),
        "best": None if best is None else default_metric(best.final_metric),
        "bestTrial": None if best is None else {"trialId": best.id, "sequenceId": best.sequence_id},
        "optimizeMode": config.optimize_mode,
        "trialCount": sum(counts.values()),
        "trialCounts": counts,
        "mayChange": may_act(caller, state.team, f"experiment {state.id}") is None,
    }


def _listed(raw: str | None, name: str, known: list[str]) -> set[str] | None:
    if not raw:
        return None
    given = set(raw.split(","))
    if unknown := given - set(known):
        raise Refused(400, f"{name} must be a comma-separated list of {', '.join(known)}, not {sorted(unknown)}")
    return given


def listing(model: Model, params: dict[str, str], caller: Caller) -> list[dict[str, Any]]:
    """Every experiment's row under the filter, sorted: O(E · statuses + E log E)."""
    sort, order = params.get("sort", "start"), params.get("order", "desc")
    if sort not in SORTS:
        raise Refused(400, f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
    if order not in ("asc", "desc"):
        raise Refused(400, f"order must be asc or desc, not {order!r}")
    statuses = _listed(params.get("status"), "status", [s.value for s in ExperimentStatus])
    text = params.get("q", "").strip().casefold()
    platform, team = params.get("platform") or None, params.get("team") or None
    rows = []
    for state in model.experiments.values():
        if statuses is not None and state.status.value not in statuses:
            continue
        if team is not None and state.team != team:
            continue
        if text and text not in state.id.casefold() and text not in (state.config.experiment_name or "").casefold():
            continue
        if platform is not None and platform not in {s.platform for s in state.config.training_services}:
            continue
        rows.append(row(model, state, caller))
    key = SORTS[sort]
    descending = order == "desc"
    rows.sort(key=lambda r: r["id"], reverse=descending)  # ties in a stable order
    with_key = [r for r in rows if key(r) is not None]
    rows = sorted(with_key, key=key, reverse=descending) + [r for r in rows if key(r) is None]
    return rows


def routes(model: Model, dispatcher: Dispatcher, respond: Callable[[Any], Response]) -> APIRouter:
    """The list, and the actions the page adds to stop (which the experiment page has already)."""
    api = APIRouter()

    def relayed(operation: str) -> Callable[[str, Request], Any]:
        async def act(experiment_id: str, request: Request) -> Response:
            result = await dispatcher.call(operation, {"id": experiment_id}, request.state.person.token) or {}
            return respond({"id": experiment_id, "status": result.get("status"), "deleted": result.get("deleted")})

        return act

    api.add_api_route(
        "/experiments/{experiment_id}/resume",
        relayed("experiment.resume"),
        methods=["POST"],
        responses=doc.refusals(*CHANGE, *RELAYED),
        summary="Resume a stopped experiment (relayed; 409 when it has nothing left to run)",
    )
    api.add_api_route(
        "/experiments/{experiment_id}/delete",
        relayed("experiment.delete"),
        methods=["POST"],
        responses=doc.refusals(*CHANGE, *RELAYED),
        summary="Delete a stopped or done experiment with its trials (relayed; 409 while it runs)",
    )

    @api.get(
        "/experiments/{experiment_id}/export",
        responses=doc.refusals(*READ, 404),
        openapi_extra=doc.parameters(
            doc.parameter("format", "query", {"type": "string", "enum": list(FORMATS), "default": "json"}, "the file")
        ),
    )
    async def export_trials(experiment_id: str, request: Request) -> Response:
        """Every trial's parameters, final result and status, as ``trialbus experiment export`` (and
        ``nnictl experiment export``) writes them, as a download: O(n log n) for n trials."""
        if experiment_id not in model.experiments:
            raise Refused(404, f"experiment {experiment_id!r} not found")
        kind = request.query_params.get("format", "json")
        if kind not in FORMATS:
            raise Refused(400, f"format must be json or csv, not {kind!r}")
        trials = list(model.trials_of.get(experiment_id, {}).values())  # a copy: the feed goes on meanwhile
        media_type, write = FORMATS[kind]
        text = await asyncio.to_thread(lambda: write(export.records(trials)))
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", experiment_id)  # an id from the bucket, never a header's quote
        headers = {
            "Content-Disposition": f'attachment; filename="{name}-trials.{kind}"',
            "Cache-Control": "no-store",
        }
        return Response(text, media_type=media_type, headers=headers)

    return api
