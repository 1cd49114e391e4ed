"""Editing a running experiment from its page: ``PATCH /api/experiments/{id}`` with any of
``trialConcurrency``, ``maxTrialNumber``, ``maxExperimentDuration`` and ``searchSpace``, forwarded to the
dispatcher's ``experiment.update`` as the person logged in (their token), as stop and cancel are
(:mod:`services.webui.actions`). The dispatcher validates (422 naming the value, nothing changed), checks who
may change the experiment (viewers and other teams' members: 403) and acts on it; its answer and its message
reach the browser as they are. The page's form is ``static/edit.js``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from services.common import openapi as doc
from services.webui.actions import Dispatcher, Refused
from services.webui.openapi import CHANGE, RELAYED

#: The most bytes a change may hold (a search space is a few KiB; the dispatcher has its own limit).
MAX_BODY = 256 * 1024


def add_edit_routes(api: APIRouter, dispatcher: Dispatcher, respond: Callable[[Any], Response]) -> None:
    """Register the route on the web UI's ``/api`` router (before it is included in the app);
    ``respond`` makes the JSON response, as the app's other routes do."""

    @api.patch("/experiments/{experiment_id}", responses=doc.refusals(*CHANGE, 413, 415, 422, *RELAYED))
    async def update_experiment(experiment_id: str, request: Request) -> Response:
        changes = await _json_object(request)
        result = await dispatcher.call(
            "experiment.update", {"id": experiment_id, "changes": changes}, request.state.person.token
        )
        return respond(result)


async def _json_object(request: Request) -> dict:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise Refused(415, "send the change as JSON (Content-Type: application/json)")
    raw = b""
    async for chunk in request.stream():  # O(body), bounded by MAX_BODY
        raw += chunk
        if len(raw) > MAX_BODY:
            raise Refused(413, f"the change is over {MAX_BODY} bytes")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refused(400, f"the change is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Refused(400, 'the change must be a JSON object, e.g. {"trialConcurrency": 4}')
    return data
