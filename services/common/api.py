"""Calling the dispatcher's NATS API (``trialbus.api.<op>``) from a service, as clients do.

Services that act for people or tuners (the tuner service, the web UI) go through the same
operations, checks and answers as the REST API and the Python client: never around them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import nats.errors
import orjson
from nats.aio.client import Client

from contracts import subjects


class ApiCallError(Exception):
    """The dispatcher refused the call (``status`` is HTTP-like), or none answered (503/504)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def call(nc: Client, operation: str, body: Mapping[str, Any], timeout: float = 10.0) -> Any:
    """The ``result`` of one operation; :class:`ApiCallError` with the dispatcher's status and message."""
    try:
        reply = await nc.request(subjects.api(operation), orjson.dumps(dict(body)), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise ApiCallError(503, "no dispatcher is running (nobody answers trialbus.api.*)") from None
    except (nats.errors.TimeoutError, TimeoutError):
        raise ApiCallError(504, f"the dispatcher did not answer {operation} within {timeout:g}s") from None
    answer = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise ApiCallError(int(answer.get("status", 500)), str(answer.get("error", "unknown error")))
    return answer.get("result")
