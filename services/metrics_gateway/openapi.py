"""What ``POST /api/v1/trials/{trialId}/metrics`` reads and answers, for its OpenAPI declaration.

The route reads its body itself (size first, then JSON), so FastAPI cannot describe it; this
module does, as :mod:`services.metrics_gateway.app` checks it (docs/internals.md §2). The gateway
serves no schema (trials are its only callers); ``make fuzz`` builds it from the app.
"""

from __future__ import annotations

from typing import Any

from contracts import VERSION
from services.common import openapi as doc


def record(types: frozenset[str]) -> dict[str, Any]:
    """One NNI metric record, as the NNI SDK writes it (``nni/runtime/platform``)."""
    return {
        "type": "object",
        "description": "value is required except for REQUEST_PARAMETER; a string value must be JSON text "
        "(NNI's json_tricks, NaN and Infinity allowed), another value is encoded as NNI would",
        "properties": {
            "trial_job_id": {"type": "string", "description": "the trial of the URL, else 400"},
            "type": {"type": "string", "enum": sorted(types)},
            "sequence": {"type": "integer", "minimum": 0},
            "parameter_id": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
            "value": {},
        },
        "required": ["trial_job_id", "type", "sequence"],
    }


def batch_body(max_records: int, types: frozenset[str]) -> dict[str, Any]:
    """``openapi_extra=``: the version header and the batch (``gateway_max_records`` records at most)."""
    batch = {
        "type": "object",
        "properties": {
            "experimentId": {"type": "string", "minLength": 1, "pattern": "^[^.*> \t\r\n]+$"},
            "records": {
                "type": "array",
                "maxItems": max_records,
                "items": {"anyOf": [{"type": "string", "description": "a record as JSON text"}, record(types)]},
            },
        },
        "required": ["experimentId", "records"],
    }
    version = doc.parameter(
        "X-Trialbus-Keeper-Version",
        "header",
        {"type": "string", "example": VERSION},
        f"the trial keeper's version: its major.minor must be this gateway's ({VERSION}), else 409",
        required=True,
    )
    return doc.merge(doc.parameters(version), doc.json_body(batch, "a batch of one trial's metric records"))


ACCEPTED = {"type": "object", "properties": {"accepted": {"type": "integer", "minimum": 0}}, "required": ["accepted"]}

RESPONSES = {
    **doc.answer(
        200, "every record published and acked by JetStream (resent records are dropped as duplicates)", ACCEPTED
    ),
    **doc.refusals(
        400,
        401,
        409,
        413,
        503,
        why={
            400: "no version header, a body that is not a batch, or a bad record (the message names its index)",
            401: "no trial token, or not this trial's",
            409: "the keeper's major.minor version is not the gateway's: run the keeper of this release",
            413: "the body or the number of records is over the limit: split the batch",
            503: "NATS is unavailable or JetStream did not ack in time: retry (records are deduplicated)",
        },
    ),
}
