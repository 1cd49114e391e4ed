"""The user's actions, sent to the dispatcher exactly as clients send them: NATS
request/reply on ``trialbus.api.<op>`` (``services/dispatcher/bus_api.py``), through
:func:`services.common.api.call`.

The dispatcher answers ``{"ok": true, "result": …}`` or ``{"ok": false, "status": <http>,
"error": "…"}``; its status and message go to the browser as they are, so a user reads
the same sentence (``trial T already ended SUCCEEDED``) as from the CLI or the REST API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from services.common import api
from services.common.bus import Bus


class Refused(Exception):
    """An answer other than 2xx, with the message for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Dispatcher:
    """Calls the dispatcher's NATS API; every failure becomes :class:`Refused`."""

    def __init__(self, bus: Callable[[], Bus | None], timeout: float) -> None:
        self.bus = bus
        self.timeout = timeout

    async def call(self, operation: str, body: dict[str, Any], token: str | None = None) -> Any:
        """``operation`` asked as the person ``token`` names (None: as the web UI, the stack's admin)."""
        bus = self.bus()
        if bus is None or not bus.nc.is_connected:
            raise Refused(503, "NATS is unavailable; retry in a moment")
        try:
            return await api.call(bus.nc, operation, body, self.timeout, token)
        except api.ApiError as exc:
            status = exc.status if 400 <= exc.status <= 599 else 502
            raise Refused(status, exc.message) from None
        except (orjson.JSONDecodeError, AttributeError):  # not a JSON object: not the dispatcher's answer
            raise Refused(502, f"the dispatcher's answer to {operation} is not a JSON object") from None

    async def cancel_trial(self, trial_id: str, token: str | None = None) -> Any:
        return await self.call("trial.cancel", {"id": trial_id}, token)

    async def retry_trial(self, trial_id: str, token: str | None = None) -> Any:
        """Run a trial that has ended again, as its next attempt (409 while it runs, or when its
        experiment is not RUNNING: the dispatcher's sentence says which)."""
        return await self.call("trial.retry", {"id": trial_id}, token)

    async def stop_experiment(self, experiment_id: str, token: str | None = None) -> Any:
        return await self.call("experiment.stop", {"id": experiment_id}, token)

    async def activity(self, experiment_id: str, token: str | None = None) -> list[dict[str, Any]]:
        """The newest changes asked about the experiment's work (those the person may see)."""
        result = await self.call("audit.list", {"experiment": experiment_id, "limit": 100}, token)
        if not isinstance(result, list):
            raise Refused(502, "the dispatcher's answer to audit.list is not a list")
        return result

    async def queue(self, token: str | None = None) -> list[dict[str, Any]]:
        """Each shared platform's capacity, use and waiting experiments in order, with why each waits."""
        return await self._read("queue", token)

    async def teams(self, token: str | None = None) -> list[dict[str, Any]]:
        """Every team's quota, weight and use per platform (borrowed capacity, experiments waiting)."""
        return await self._read("team.list", token)

    async def _read(self, operation: str, token: str | None) -> list[dict[str, Any]]:
        """A list the dispatcher alone knows (it decides who runs next): no dispatcher answering is
        503 either way, as the page can only say "not now"."""
        try:
            result = await self.call(operation, {}, token)
        except Refused as exc:
            if exc.status == 504:
                raise Refused(503, f"{exc.message}; it decides who runs next, so ask again in a moment") from None
            raise
        if not isinstance(result, list):
            raise Refused(502, f"the dispatcher's answer to {operation} is not a list")
        return result

    async def trial_log(self, trial_id: str, max_bytes: int, attempt: int | None = None) -> str:
        body = {"id": trial_id, "maxBytes": max_bytes, **({} if attempt is None else {"attempt": attempt})}
        result = await self.call("trial.log", body)
        if not isinstance(result, dict) or not isinstance(result.get("text"), str):
            raise Refused(502, "the dispatcher's answer to trial.log has no text")
        return result["text"]
