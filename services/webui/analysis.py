"""The routes of the experiment page's analysis views: hyper-parameters and durations.

    GET /api/experiments/{id}/hyper-parameters?top=p&lines=n
        the parallel-coordinates view (:mod:`services.webui.hparams`): axes and the lines of
        the best ``top`` % of the trials with a final metric (1–100, default 100), at most
        ``n`` lines (1–2,000, default 2,000); O(n · (log N + parameters))
    GET /api/experiments/{id}/durations?bins=b
        a histogram of the ended trials' durations in ``b`` bins (1–200, default 20), with the
        count, median and 90th percentile, and how many trials run now
        (:mod:`services.webui.durations`); O(b · log N)

The top trials table of the overview needs no route of its own: it is the trial table's
window sorted by metric (``/trials?sort=metric&limit=10``).

:func:`routes` is included in the web UI's ``/api`` router, behind its authorisation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from contracts.state import TrialStatus
from services.common import openapi as doc
from services.webui import hparams
from services.webui.actions import Refused
from services.webui.durations import BINS_RANGE, DEFAULT_BINS
from services.webui.model import Model
from services.webui.openapi import READ


def whole(params: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """A whole-number query parameter from ``low`` to ``high``; ``default`` without it; else 400."""
    raw = params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise Refused(400, f"{name} must be a whole number from {low} to {high}, not {raw!r}")
    return int(raw)


def _integer(name: str, low: int, high: int, default: int, what: str) -> dict[str, Any]:
    schema = {"type": "integer", "minimum": low, "maximum": high, "default": default}
    return doc.parameter(name, "query", schema, what)


def routes(model: Model, json_response: Callable[[Any], Response]) -> APIRouter:
    """The two reads, answered from ``model`` (:mod:`services.webui.model`)."""
    router = APIRouter()

    def known(experiment_id: str) -> None:
        if experiment_id not in model.experiments:
            raise Refused(404, f"experiment {experiment_id!r} not found")

    @router.get(
        "/experiments/{experiment_id}/hyper-parameters",
        responses=doc.refusals(*READ, 404),
        openapi_extra=doc.parameters(
            _integer("top", *hparams.TOP_RANGE, 100, "the best this many per cent of the trials with a final metric"),
            _integer("lines", *hparams.LINES_RANGE, hparams.MAX_LINES, "at most this many lines"),
        ),
    )
    async def hyper_parameters(experiment_id: str, request: Request) -> Response:
        """Axes (one per parameter, nested choices flattened, then the final metric) and one line
        per trial shown: ``{"id", "sequence", "metric", "values"}`` (a categorical axis' value is
        the position of its category; ``null``: absent). ``rule`` says which trials are shown."""
        known(experiment_id)
        params = dict(request.query_params)
        top = whole(params, "top", 100, *hparams.TOP_RANGE)
        lines = whole(params, "lines", hparams.MAX_LINES, *hparams.LINES_RANGE)
        return json_response(hparams.hyper_parameters(model, experiment_id, top, lines))

    @router.get(
        "/experiments/{experiment_id}/durations",
        responses=doc.refusals(*READ, 404),
        openapi_extra=doc.parameters(_integer("bins", *BINS_RANGE, DEFAULT_BINS, "how many bins")),
    )
    async def durations(experiment_id: str, request: Request) -> Response:
        """``{"count", "bins": [{"from", "to", "count"}], "min", "median", "p90", "max", "running"}``,
        in seconds: the durations of the trials that ended, start to end."""
        known(experiment_id)
        bins = whole(dict(request.query_params), "bins", DEFAULT_BINS, *BINS_RANGE)
        found = model.durations.get(experiment_id)
        body = found.histogram(bins) if found is not None else {"count": 0, "bins": []}
        body["running"] = model.counts(experiment_id)[TrialStatus.RUNNING.value]
        return json_response(body)

    return router
