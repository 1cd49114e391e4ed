"""What the web UI's routes read and answer, for their OpenAPI declarations.

The schema is served at ``GET /api/openapi.json`` without a token: it describes the routes and
holds no data (no experiment, trial or setting), like the dispatcher's. No docs page is served.
``make fuzz`` drives every route from it.
"""

from __future__ import annotations

from typing import Any

from services.common import openapi as doc

#: Every route behind the token may be refused by the authorisation (400 Host, 401 token); a state
#: change also by 403 (Origin, read-only token). Refusals of ``/api/…`` are JSON, of pages HTML.
READ = (400, 401)
CHANGE = (400, 401, 403)
#: The dispatcher's answers that a relayed action passes on, and what the relay itself adds.
RELAYED = (404, 409, 502, 503, 504)

_PAGE = {"type": "string", "description": "an HTML page"}


def page(*refusals: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of an HTML page: the page, or a page saying why not (as HTML)."""
    answers = doc.answer(200, "the page (drawn by /static/app.js)", _PAGE, "text/html")
    for status in refusals:
        answers[status] = {"description": doc.WHY[status], "content": {"text/html": {"schema": _PAGE}}}
    return answers


def event_stream(description: str, *refusals: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a server-sent event stream (it stays open until the browser leaves)."""
    return {**doc.answer(200, description, {"type": "string"}, "text/event-stream"), **doc.refusals(*refusals)}


STATIC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the file (no data in it: served without a token)",
        "content": {
            kind: {"schema": {"type": "string"}}
            for kind in ("text/html", "text/javascript", "text/css", "image/svg+xml")
        },
    },
    404: {"description": "no such file", "content": {"text/html": {"schema": _PAGE}}},
}

EXPERIMENT_FILTER = doc.parameters(
    doc.parameter("experiment", "query", {"type": "string"}, "only this experiment's events (404 if unknown)")
)


def log_size(maximum: int) -> dict[str, Any]:
    """The ``maxBytes`` and ``attempt`` query parameters of ``GET /api/trials/{id}/log``."""
    schema = {"type": "integer", "minimum": 1, "maximum": maximum, "default": 64 * 1024}
    return doc.parameters(
        doc.parameter("maxBytes", "query", schema, "how much of the log's tail, in bytes"),
        doc.parameter(
            "attempt",
            "query",
            {"type": "integer", "minimum": 0},
            "an earlier attempt's log (0 is the first); the current attempt's without it",
        ),
    )


def table_window(max_rows: int, default_rows: int, statuses: list[str]) -> dict[str, Any]:
    """The query parameters of ``GET /api/experiments/{id}/trials`` (:mod:`services.webui.queries`)."""
    one = f"({'|'.join(statuses)})"
    return doc.parameters(
        doc.parameter(
            "offset",
            "query",
            {"type": "integer", "minimum": 0, "maximum": 10**9, "default": 0},
            "the first row's position under the sort and filter",
        ),
        doc.parameter(
            "limit",
            "query",
            {"type": "integer", "minimum": 1, "maximum": max_rows, "default": default_rows},
            "how many rows",
        ),
        doc.parameter(
            "sort",
            "query",
            {"type": "string", "enum": ["sequence", "metric"], "default": "sequence"},
            "submission order, or the final default metric best first (optimize_mode aware)",
        ),
        doc.parameter(
            "order",
            "query",
            {"type": "string", "enum": ["asc", "desc"], "default": "asc"},
            "desc: newest first, or the worst metric first (trials without one stay last)",
        ),
        doc.parameter(
            "status",
            "query",
            {"type": "string", "pattern": f"^{one}(,{one})*$"},
            "only these statuses, comma-separated",
        ),
    )


def chart_points(low: int, high: int, what: str) -> dict[str, Any]:
    """The ``points`` query parameter of a chart's read: about twice the chart's width in pixels."""
    return doc.parameters(doc.parameter("points", "query", {"type": "integer", "minimum": low, "maximum": high}, what))
