"""Calling the dispatcher's NATS API (``trialbus.api.<op>``) from a service, as clients do, and
:class:`ApiError`, the refusal both sides of that API share.

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


class ApiError(Exception):
    """A call of the dispatcher's API that is not served, on either side of the bus.

    The dispatcher's API layers raise it (``status`` is the HTTP status to answer with) and turn
    it into the answer: an HTTP error (:mod:`services.dispatcher.api`) or a NATS reply with ``ok``
    false (:mod:`services.dispatcher.bus_api`). A service calling that NATS API (:func:`call`)
    gets it back with the dispatcher's status and message, or 503/504 when no dispatcher answered.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def call(
    nc: Client, operation: str, body: Mapping[str, Any], timeout: float = 10.0, token: str | None = None
) -> Any:
    """The ``result`` of one operation; :class:`ApiError` with the dispatcher's status and message.
    With ``token``, the person it names asks (``Authorization`` header); without, the caller's
    NATS credential speaks."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        reply = await nc.request(subjects.api(operation), orjson.dumps(dict(body)), timeout=timeout, headers=headers)
    except nats.errors.NoRespondersError:
        raise ApiError(503, "no dispatcher is running (nobody answers trialbus.api.*)") from None
    except (nats.errors.TimeoutError, TimeoutError):
        raise ApiError(504, f"the dispatcher did not answer {operation} within {timeout:g}s") from None
    answer = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise ApiError(int(answer.get("status", 500)), str(answer.get("error", "unknown error")))
    return answer.get("result")
