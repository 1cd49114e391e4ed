"""The query strings of the web UI's reads that scale with an experiment: the trial table's
window and the sizes of its charts. Each is checked here, once, and refused with what to send.

``GET /api/experiments/{id}/trials``:

    offset   the first row's position, 0 or more (default 0): any row of 100,000 in one read
    limit    rows, 1 to ``MAX_ROWS`` (default ``DEFAULT_ROWS``)
    sort     ``sequence`` (submission order, default) or ``metric`` (best final metric first,
             ``optimize_mode`` aware; trials without one last)
    order    ``asc`` (default) or ``desc``: newest first, or worst metric first
    status   a comma-separated filter (``SUCCEEDED,FAILED``); all statuses without one

answered as ``{"total": rows under the filter, "offset", "trials": [row, …]}`` in
O(log n + limit) (:meth:`services.webui.model.Model.window`).

``points`` (the charts): how many points the chart can show, ``POINTS_RANGE``; about twice
the chart's width in pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from contracts.state import TrialStatus
from services.common.trial_index import ORDERS, Order
from services.webui.actions import Refused
from services.webui.curves import POINTS_RANGE

DEFAULT_ROWS = 100
MAX_ROWS = 500


#: What _whole answers without the parameter: a number, or None where the caller has no default.
_Default = TypeVar("_Default", bound=int | None)


@dataclass(frozen=True, slots=True)
class TableQuery:
    order: Order
    descending: bool
    statuses: list[TrialStatus] | None
    offset: int
    limit: int


def _whole(params: dict[str, str], name: str, default: _Default, low: int, high: int) -> int | _Default:
    raw = params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise Refused(400, f"{name} must be a whole number from {low} to {high}, not {raw!r}")
    return int(raw)


def table_query(params: dict[str, str]) -> TableQuery:
    sort = params.get("sort", "sequence")
    if sort not in ORDERS:
        raise Refused(400, f"sort must be one of {', '.join(ORDERS)}, not {sort!r}")
    order = params.get("order", "asc")
    if order not in ("asc", "desc"):
        raise Refused(400, f"order must be asc or desc, not {order!r}")
    statuses = None
    if raw := params.get("status"):
        try:
            statuses = [TrialStatus(s) for s in raw.split(",")]
        except ValueError:
            known = ", ".join(s.value for s in TrialStatus)
            raise Refused(400, f"status must be a comma-separated list of {known}, not {raw!r}") from None
    return TableQuery(
        order=sort,  # checked against ORDERS above
        descending=order == "desc",
        statuses=statuses,
        offset=_whole(params, "offset", 0, 0, 10**9),
        limit=_whole(params, "limit", DEFAULT_ROWS, 1, MAX_ROWS),
    )


def points(params: dict[str, str], default: int | None) -> int | None:
    """The chart's ``points``; ``default`` without one."""
    return _whole(params, "points", default, *POINTS_RANGE) if "points" in params else default
