"""The REST operations as NATS request/reply on ``trialbus.api.<op>`` and
``trialbus.as.<person>.<op>`` (docs/internals.md §3).

Replies are ``{"ok": true, "result": …}`` or ``{"ok": false, "status": <http>, "error": "…"}``,
so a client gets the same answers and messages over NATS as over HTTP.

Who is asking:

- ``trialbus.as.<person>.<key>.<op>``: that person. Only a NATS connection let in with their
  token may publish there (the auth callout grants it: :mod:`.callout`; ``key`` names the token),
  so the subject is who asks; a removed user, or a token replaced since the connection was
  opened, is refused (401), and a bearer token in the headers, if any, must be that person's.
- ``trialbus.api.<op>``, the services' door: a request with an ``Authorization: Bearer <token>``
  header is that token's person, with the same checks and audit as over HTTP (an unknown token:
  401). A request without one is the stack's admin: the NATS credential that could send it is
  the authority (only the stack's services and whoever holds ``client.json`` have one;
  docs/security.md, "People", says what this leaves open).
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
from contracts.people import ADMIN, Caller
from services.common import platforms
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher import history, updates
from services.dispatcher.core import Dispatcher
from services.dispatcher.queries import PAGE_DEFAULT

log = logging.getLogger(__name__)


Operation = Callable[[dict, Caller], Awaitable[Any]]


def _operations(core: Dispatcher) -> dict[str, Operation]:
    people = core.people

    async def create(body: dict, caller: Caller) -> Any:
        async with people.acting(caller, "experiment.create") as made:
            made.experiment = (await core.create_experiment(body.get("config"), caller)).id
            return {"id": made.experiment}

    async def get_experiment(body: dict, caller: Caller) -> Any:
        return core.experiment_view(core.experiment(_text(body, "id")))

    async def stop(body: dict, caller: Caller) -> Any:
        experiment_id, message = _text(body, "id"), _message(body)
        async with people.acting(caller, "experiment.stop", experiment_id=experiment_id):
            return core.experiment_view(await core.stop_experiment(experiment_id, message))

    async def close(body: dict, caller: Caller) -> Any:
        experiment_id = _text(body, "id")
        async with people.acting(caller, "experiment.close", experiment_id=experiment_id):
            return core.experiment_view(await core.close_experiment(experiment_id))

    async def resume(body: dict, caller: Caller) -> Any:
        experiment_id = _text(body, "id")
        async with people.acting(caller, "experiment.resume", experiment_id=experiment_id):
            return core.experiment_view(await core.resume_experiment(experiment_id))

    async def import_results(body: dict, caller: Caller) -> Any:
        experiment_id = _text(body, "id")
        async with people.acting(caller, "experiment.import", experiment_id=experiment_id) as whose:
            state = await core.import_results(experiment_id, body.get("data"))
            whose.note = f"imported {len(body['data'])} results"
            return core.experiment_view(state)

    async def update(body: dict, caller: Caller) -> Any:
        experiment_id = _text(body, "id")
        async with people.acting(caller, "experiment.update", experiment_id=experiment_id) as whose:
            state, changed = await core.update_experiment(experiment_id, body.get("changes"))
            whose.note = updates.describe(changed)
        return updates.answer(core.experiment_view(state), changed)

    async def delete(body: dict, caller: Caller) -> Any:
        experiment_id = _text(body, "id")
        async with people.acting(caller, "experiment.delete", experiment_id=experiment_id):
            return await core.delete_experiment(experiment_id)

    async def submit(body: dict, caller: Caller) -> Any:
        experiment_id = _text(body, "experimentId")
        async with people.acting(caller, "trial.submit", experiment_id=experiment_id):
            trial = await core.submit_trial(experiment_id, body.get("parameters"), body.get("parameterId"))
        return {"id": trial.id, "sequenceId": trial.sequence_id, "status": trial.status.value}

    async def cancel(body: dict, caller: Caller) -> Any:
        status = body.get("status", TrialStatus.USER_CANCELED.value)
        if status not in _CANCEL_STATUSES:
            raise ApiError(422, f"status must be one of {', '.join(_CANCEL_STATUSES)} (how the trial ends)")
        trial_id, message = _text(body, "id"), _message(body)
        experiment_id = core.trial(trial_id).experiment_id
        async with people.acting(caller, "trial.cancel", experiment_id=experiment_id, target=trial_id):
            trial = await core.cancel_trial(trial_id, TrialStatus(status), message)
        return {"id": trial.id, "status": trial.status.value}

    async def retry(body: dict, caller: Caller) -> Any:
        trial_id = _text(body, "id")
        experiment_id = core.trial(trial_id).experiment_id
        async with people.acting(caller, "trial.retry", experiment_id=experiment_id, target=trial_id):
            trial = await core.retry_trial(trial_id)
        return {"id": trial.id, "status": trial.status.value, "attempt": trial.attempt}

    async def drain(body: dict, caller: Caller) -> Any:
        drain = body.get("drain", True)
        if not isinstance(drain, bool):
            raise ApiError(422, "drain must be true (drain the replica) or false (take trials again)")
        adapter, replica = _text(body, "adapter"), _text(body, "replica")
        async with people.audited(caller, "platform.drain" if drain else "platform.undrain", f"{adapter}/{replica}"):
            if caller.role != "admin":  # a replica runs every team's trials
                raise ApiError(403, f"{caller.name} is a {caller.role}: only an admin may drain a platform's replica")
            reply = await history.drain(core.bus, adapter, replica, drain, core.settings.control_timeout)
        return {"replica": reply.replica, "draining": reply.draining, "preempted": reply.preempted}

    async def trial_page(body: dict, caller: Caller) -> Any:
        limit = body.get("limit", PAGE_DEFAULT)
        cursor, status, sort = body.get("cursor"), body.get("status"), body.get("sort", "sequence")
        for name, value in (("cursor", cursor), ("status", status), ("sort", sort)):
            if value is not None and not isinstance(value, str):
                raise ApiError(422, f"{name} must be a string")
        return core.list_trials(_text(body, "experimentId"), limit, cursor, status, sort)

    async def log_tail(body: dict, caller: Caller) -> Any:
        attempt = body.get("attempt")
        if attempt is not None and (not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0):
            raise ApiError(422, "attempt must be a whole number, 0 or more (the trial's first attempt is 0)")
        return {"text": await core.trial_log(_text(body, "id"), int(body.get("maxBytes", 64 * 1024)), attempt)}

    async def sync(fn: Callable[[], Any]) -> Any:
        return fn()

    async def add_user(body: dict, caller: Caller) -> Any:
        return await people.add(caller, body.get("name"), body.get("team"), body.get("role", "member"))

    async def audit(body: dict, caller: Caller) -> Any:
        limit, team, experiment = body.get("limit", 100), body.get("team"), body.get("experiment")
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise ApiError(422, "limit must be a whole number")
        for name, value in (("team", team), ("experiment", experiment)):
            if value is not None and not isinstance(value, str):
                raise ApiError(422, f"{name} must be a string")
        return await people.audit(caller, limit, team, experiment)

    return {
        "experiment.create": create,
        "experiment.list": lambda body, caller: sync(core.list_experiments),
        "experiment.get": get_experiment,
        "experiment.stop": stop,
        "experiment.close": close,
        "experiment.resume": resume,
        "experiment.delete": delete,
        "experiment.import": import_results,
        "experiment.update": update,
        "trial.submit": submit,
        "trial.list": trial_page,
        "trial.get": lambda body, caller: sync(lambda: core.trial(_text(body, "id")).view()),
        "trial.cancel": cancel,
        "trial.retry": retry,
        "trial.metrics": lambda body, caller: core.trial_metrics(_text(body, "id")),
        "trial.log": log_tail,
        "platform.list": lambda body, caller: _platforms(core),
        "platform.drain": drain,
        "whoami": lambda body, caller: sync(caller.view),
        "user.list": lambda body, caller: sync(lambda: people.users(caller)),
        "user.add": lambda body, caller: people.add(
            caller, body.get("name"), body.get("team"), body.get("role", "member")
        ),
        "user.remove": lambda body, caller: people.remove(caller, _text(body, "name")),
        "user.rotate": lambda body, caller: people.rotate(caller, _text(body, "name")),
        "audit.list": audit,
        "team.list": lambda body, caller: sync(core.teams.all),
        "team.set": lambda body, caller: core.teams.set(caller, _text(body, "name"), body.get("share", {})),
        "team.remove": lambda body, caller: core.teams.remove(caller, _text(body, "name")),
        "queue": lambda body, caller: sync(core.teams.queue),
    }


def _caller(core: Dispatcher, msg: Msg, door: tuple[str, str] | None) -> Caller:
    """Who sent ``msg``: the person of its ``door`` (its subject's ``trialbus.as.<person>.<key>``),
    else its bearer token's person; without either, the stack's admin (module docstring)."""
    scheme, _, presented = (msg.headers or {}).get("Authorization", "").partition(" ")
    presented = presented.strip()
    token = presented if scheme.lower() == "bearer" else None
    if door is not None:
        person, key = door
        caller = core.people.at_door(person, key)
        if caller is None:
            why = "was removed" if core.people.named(person) is None else "has a new token since this connection"
            raise ApiError(401, f"user {person} {why}; connect again with their current token")
        if presented and core.people.person(token) != caller:
            raise ApiError(401, f"the token in the request's Authorization header is not {person}'s")
        return caller
    if not presented:
        return ADMIN
    caller = core.people.identify(token) if token else None
    if caller is None:
        raise ApiError(401, "wrong API token in the request's Authorization header (`trialbus whoami` checks yours)")
    return caller


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


async def serve(bus: Bus, core: Dispatcher) -> list[Subscription]:
    """Answer ``trialbus.api.*`` and ``trialbus.as.*.*.*`` requests until the subscriptions are drained."""
    operations = _operations(core)
    prefix, as_prefix = subjects.api(""), subjects.API_AS_PREFIX + "."

    async def handle(msg: Msg) -> None:
        door, op = None, msg.subject.removeprefix(prefix)
        if msg.subject.startswith(as_prefix):  # trialbus.as.<person>.<key>.<op>: a name and a key have no dot
            person, key, op = (msg.subject.removeprefix(as_prefix).split(".", 2) + ["", ""])[:3]
            door = (person, key)
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
            reply = {"ok": True, "result": await handler(body, _caller(core, msg, door))}
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

    return [
        await bus.nc.subscribe(subjects.api(">"), queue="dispatcher", cb=spawn),
        await bus.nc.subscribe(subjects.api_as("*", "*", ">"), queue="dispatcher", cb=spawn),
    ]
