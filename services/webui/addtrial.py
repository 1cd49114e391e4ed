"""Add a trial: one more trial of a running experiment, with parameters a person typed or copied from
another trial (NNI's "customized trial").

    POST /api/experiments/{id}/trials   {"parameters": {…}} → 201 {"id", "sequenceId", "status"}

Relayed to the dispatcher's ``trial.submit`` as the person logged in (:mod:`services.webui.actions`), so the
dispatcher checks their role and team (a viewer, or a member of another team: 403), the experiment's state
and limits (409, saying which: not RUNNING, ``maxTrialNumber`` reached, ``maxExperimentDuration`` passed, the
tuner has no more trials). No ``parameterId`` is sent: to the tuner service the trial is one it did not propose,
which it takes as NNI's customized trial (``services/tuner/nni_classes.py``: a user's tuner gets its result
through ``receive_trial_result(None, …, customized=True)`` when it accepts customized trials, NNI's rule; a
built-in tuner learns from it like its own), and it counts toward ``maxTrialNumber`` for the dispatcher and the
tuner alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from services.common import openapi as doc
from services.webui.actions import Dispatcher, Refused
from services.webui.openapi import CHANGE, RELAYED

#: The largest body taken, in bytes: parameters are a few fields, not data.
MAX_BODY = 64 * 1024
EXAMPLE = '{"parameters": {"lr": 0.01, "batch_size": 32}}'
ADDED = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "sequenceId": {"type": "integer"}, "status": {"const": "WAITING"}},
}
BODY = {
    "type": "object",
    "required": ["parameters"],
    "additionalProperties": False,
    "properties": {"parameters": {"type": "object", "description": "what nni.get_next_parameter() returns"}},
}


async def parameters_of(request: Request) -> dict[str, Any]:
    """The ``parameters`` object of the request's body, or :class:`Refused` (400) saying what to send."""
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise Refused(413, f"the body is over {MAX_BODY // 1024} KiB; parameters are a small JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refused(400, f"the body is not JSON ({exc}); send {EXAMPLE}") from None
    if not isinstance(body, dict) or "parameters" not in body:
        raise Refused(400, f"send the trial's parameters as {EXAMPLE}")
    unknown = set(body) - {"parameters"}
    if unknown:
        raise Refused(400, f"unknown field(s) {', '.join(sorted(unknown))}: send only parameters, as {EXAMPLE}")
    parameters = body["parameters"]
    if not isinstance(parameters, dict):
        kind = "an array" if isinstance(parameters, list) else type(parameters).__name__
        raise Refused(400, f"parameters must be a JSON object of names and values (got {kind}), e.g. {EXAMPLE}")
    return parameters


def routes(api: APIRouter, known: Callable[[str], Any], dispatcher: Dispatcher) -> None:
    """The route (module docstring) on ``api``; ``known(id)`` raises the 404 of an unknown experiment."""

    @api.post(
        "/experiments/{experiment_id}/trials",
        status_code=201,
        openapi_extra=doc.json_body(BODY, "the trial's parameters"),
        responses={**doc.answer(201, "submitted (WAITING)", ADDED), **doc.refusals(*CHANGE, 413, *RELAYED)},
    )
    async def add_trial(experiment_id: str, request: Request) -> Response:
        """Add a trial with these parameters (NNI's customized trial): ``{"parameters": {…}}``."""
        known(experiment_id)
        parameters = await parameters_of(request)
        body = {"experimentId": experiment_id, "parameters": parameters}
        result = await dispatcher.call("trial.submit", body, request.state.person.token)
        if not isinstance(result, dict) or not isinstance(result.get("id"), str):
            raise Refused(502, "the dispatcher's answer to trial.submit names no trial")
        answer = {"id": result["id"], "sequenceId": result.get("sequenceId"), "status": result.get("status")}
        return Response(orjson.dumps(answer), status_code=201, media_type="application/json")
