"""The REST operations as NATS request/reply on ``trialbus.api.<op>`` (docs/internals.md §3).

Replies are ``{"ok": true, "result": …}`` or ``{"ok": false, "status": <http>, "error": "…"}``,
so a client gets the same answers and messages over NATS as over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts import TrialStatus, subjects
from services.common import platforms
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher import history
from services.dispatcher.core import Dispatcher
from services.dispatcher.queries import PAGE_DEFAULT

log = logging.getLogger(__name__)


def _operations(core: Dispatcher) -> dict[str, Callable[[dict], Awaitable[Any]]]:
    async def create(body: dict) -> Any:
        return {"id": (await core.create_experiment(body.get("config"))).id}

    async def get_experiment(body: dict) -> Any:
        return core.experiment_view(core.experiment(_text(body, "id")))

    async def stop(body: dict) -> Any:
        return core.experiment_view(await core.stop_experiment(_text(body, "id"), _message(body)))

    async def close(body: dict) -> Any:
        return core.experiment_view(await core.close_experiment(_text(body, "id")))

    async def resume(body: dict) -> Any:
        return core.experiment_view(await core.resume_experiment(_text(body, "id")))

    async def submit(body: dict) -> Any:
        trial = await core.submit_trial(_text(body, "experimentId"), body.get("parameters"), body.get("parameterId"))
        return {"id": trial.id, "sequenceId": trial.sequence_id, "status": trial.status.value}

    async def cancel(body: dict) -> Any:
        status = body.get("status", TrialStatus.USER_CANCELED.value)
        if status not in _CANCEL_STATUSES:
            raise ApiError(422, f"status must be one of {', '.join(_CANCEL_STATUSES)} (how the trial ends)")
        trial = await core.cancel_trial(_text(body, "id"), TrialStatus(status), _message(body))
        return {"id": trial.id, "status": trial.status.value}

    async def retry(body: dict) -> Any:
        trial = await core.retry_trial(_text(body, "id"))
        return {"id": trial.id, "status": trial.status.value, "attempt": trial.attempt}

    async def drain(body: dict) -> Any:
        drain = body.get("drain", True)
        if not isinstance(drain, bool):
            raise ApiError(422, "drain must be true (drain the replica) or false (take trials again)")
        reply = await history.drain(
            core.bus, _text(body, "adapter"), _text(body, "replica"), drain, core.settings.control_timeout
        )
        return {"replica": reply.replica, "draining": reply.draining, "preempted": reply.preempted}

    async def trial_page(body: dict) -> Any:
        limit = body.get("limit", PAGE_DEFAULT)
        cursor, status, sort = body.get("cursor"), body.get("status"), body.get("sort", "sequence")
        for name, value in (("cursor", cursor), ("status", status), ("sort", sort)):
            if value is not None and not isinstance(value, str):
                raise ApiError(422, f"{name} must be a string")
        return core.list_trials(_text(body, "experimentId"), limit, cursor, status, sort)

    async def log_tail(body: dict) -> Any:
        attempt = body.get("attempt")
        if attempt is not None and (not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0):
            raise ApiError(422, "attempt must be a whole number, 0 or more (the trial's first attempt is 0)")
        return {"text": await core.trial_log(_text(body, "id"), int(body.get("maxBytes", 64 * 1024)), attempt)}

    async def sync(fn: Callable[[], Any]) -> Any:
        return fn()

    return {
        "experiment.create": create,
        "experiment.list": lambda body: sync(core.list_experiments),
        "experiment.get": get_experiment,
        "experiment.stop": stop,
        "experiment.close": close,
        "experiment.resume": resume,
        "experiment.delete": lambda body: core.delete_experiment(_text(body, "id")),
        "trial.submit": submit,
        "trial.list": trial_page,
        "trial.get": lambda body: sync(lambda: core.trial(_text(body, "id")).view()),
        "trial.cancel": cancel,
        "trial.retry": retry,
        "trial.metrics": lambda body: core.trial_metrics(_text(body, "id")),
        "trial.log": log_tail,
        "platform.list": lambda body: _platforms(core),
        "platform.drain": drain,
    }


async def _platforms(core: Dispatcher) -> list[dict]:
    return [status.to_json() for status in await platforms.statuses(core.bus)]


#: How a cancel may end a trial: by a person, or early-stopped by an assessor.
_CANCEL_STATUSES = (TrialStatus.USER_CANCELED.value, TrialStatus.EARLY_STOPPED.value)


def _message(body: dict) -> str | None:
    message = body.get("message")
    if message is not None and (not isinstance(message, str) or len(message) > 1000):
        raise ApiError(422, "message must be a string of at most 1000 characters")
    return message


def _text(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ApiError(422, f"{key} is required (a string)")
    return value


async def serve(bus: Bus, core: Dispatcher) -> Subscription:
    """Answer ``trialbus.api.*`` requests until the subscription is drained."""
    operations = _operations(core)
    prefix = subjects.api("")

    async def handle(msg: Msg) -> None:
        op = msg.subject.removeprefix(prefix)
        try:
            handler = operations.get(op)
            if handler is None:
                raise ApiError(404, f"unknown operation {op!r}; known: {', '.join(sorted(operations))}")
            try:
                body = orjson.loads(msg.data) if msg.data else {}
            except orjson.JSONDecodeError as exc:
                raise ApiError(400, f"request body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise ApiError(400, "request body must be a JSON object")
            reply = {"ok": True, "result": await handler(body)}
        except ApiError as exc:
            reply = {"ok": False, "status": exc.status, "error": exc.message}
        except Exception as exc:  # answer instead of leaving the caller to time out
            log.exception("API operation %s failed", op)
            reply = {"ok": False, "status": 500, "error": f"internal error: {exc}"}
        if msg.reply:
            await msg.respond(orjson.dumps(reply, option=orjson.OPT_SERIALIZE_NUMPY, default=str))

    tasks: set[asyncio.Task] = set()

    async def spawn(msg: Msg) -> None:
        # One task per request: a slow call (packing code) must not hold up the others.
        task = asyncio.create_task(handle(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return await bus.nc.subscribe(subjects.api(">"), queue="dispatcher", cb=spawn)
