"""The asynchronous client: :class:`AsyncClient`, experiments, trials and metrics over the dispatcher's
NATS API (imported by users from :mod:`trialbus.client`, whose docstring says what it guarantees).

:class:`AsyncClient` speaks request/reply to ``trialbus.api.<op>`` (docs/internals.md §3) and reads the
EVENTS and METRICS streams; :class:`~trialbus.sync.Client` runs it for synchronous code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from contracts import ExperimentConfig, MetricRecord, PlatformStatus, TrialEvent, TrialState, TrialStatus, subjects
from contracts.asks import Answer, Ask
from contracts.base import ContractError
from contracts.metrics import Seen, records_of
from contracts.people import token_key, token_name
from contracts.streams import EVENTS, METRICS, stream_name
from services.common.code import CodeUpload, upload_code
from trialbus import local
from trialbus.api import ExperimentUpdate, ExperimentView, SubmittedTrial, TrialbusError, TrialMetric, TrialPage
from trialbus.api import parse as _parse
from trialbus.configs import as_config
from trialbus.follow import follow, unique
from trialbus.watcher import ExperimentWatcher, TrialOutcome

log = logging.getLogger(__name__)

#: Initial connection attempts before giving up (later drops are retried forever).
CONNECT_ATTEMPTS = 3
#: Seconds a first connection may take, all attempts together.
CONNECT_DEADLINE = 10.0
#: Messages an ``events()``/``metrics()`` iterator buffers ahead of its reader.
FOLLOW_BUFFER = 4096


class AsyncClient:
    """Connect, then call; use as ``async with AsyncClient(url) as client: ...``.

    ``url`` may list several servers, comma-separated. ``user``/``password`` or ``creds``
    (a ``.creds`` file) authenticate when the server requires it; given none, the client user of
    this user's ``trialbus up`` at ``url`` is used, found from any directory (:mod:`trialbus.local`):
    the one of ``data_dir`` (else ``TRIALBUS_DATA_DIR``) when one is named. Without ``url``, the
    NATS of that data dir's stack, else :data:`DEFAULT_NATS_URL`. ``request_timeout`` is in
    seconds. After the first connection, a lost connection is retried forever.

    ``token`` (else ``TRIALBUS_API_TOKEN``) is who asks: a person's token (``trialbus user add``
    gives one), sent with every API call, so the dispatcher checks what that person may do. Without
    one, the NATS credential alone speaks, as the stack's admin (docs/security.md, "People").

    **As a person.** Given a user's token that names them (``tbu_<name>.…``, every token made
    now) and no NATS credential (no ``user``, no ``creds``), the client connects to
    NATS with that token, nothing else: the stack's auth callout lets the person in with their
    own permissions, replies come on their inbox (``_INBOX_as.<name>``) and API calls go to their
    door (``trialbus.as.<name>.<key>.<op>``, ``key`` naming the token). No ``client.json`` is
    looked for then: a person needs only their token and the NATS URL (``TRIALBUS_NATS_URL``).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        creds: str | Path | None = None,
        request_timeout: float = 10.0,
        data_dir: str | Path | None = None,
        token: str | None = None,
    ) -> None:
        self.url = local.nats_url(url, data_dir)
        self.token = token or os.environ.get("TRIALBUS_API_TOKEN") or None
        #: The person this client connects to NATS as (class docstring), else None: a NATS user's credential.
        self.person: str | None = None
        self.data_dir = data_dir
        self.request_timeout = request_timeout
        self._auth = {"user": user, "password": password, "creds": creds}
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._watchers: dict[str, ExperimentWatcher] = {}
        self._watchers_lock = asyncio.Lock()
        self._trial_experiment: dict[str, str] = {}
        #: One callable per open events()/metrics() iterator: ends it when the client closes.
        self._followers: set[Callable[[], None]] = set()

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(
        self,
        url: str | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        creds: str | Path | None = None,
    ) -> AsyncClient:
        """Connect to NATS; arguments given here replace those of the constructor."""
        if self._nc is not None and not self._nc.is_closed:
            return self
        self.url = url or self.url
        servers = [s.strip() for s in self.url.split(",")]
        if any(s.lower().startswith(("ws://", "wss://")) for s in servers):  # see trialbus/__init__
            raise TrialbusError(400, f"{self.url}: Trialbus connects to NATS at nats:// or tls:// URLs, not WebSocket")
        auth = {**self._auth, **{k: v for k, v in {"user": user, "password": password, "creds": creds}.items() if v}}
        given = bool(auth["user"] or auth["creds"])
        self.person = None if given else token_name(self.token)
        found = None if given or self.person else local.credentials_for(self.url, self.data_dir)
        if found:
            auth["user"], auth["password"] = found  # this user's `trialbus up` at this URL: its client user

        async def quiet(*_: object) -> None:  # the default callbacks log every retry at ERROR
            pass

        refusals: list[Exception] = []

        async def remember(exc: Exception) -> None:  # the reason to give if no server takes us
            refusals.append(exc)

        options: dict[str, Any] = dict(
            servers=servers,
            name="trialbus-client",
            connect_timeout=2,
            reconnect_time_wait=0.5,
            # nats-py retries a first connection forever when this is -1; try a few times,
            # then say so, and switch to reconnect-forever once connected (below).
            max_reconnect_attempts=CONNECT_ATTEMPTS,
            error_cb=remember,
            disconnected_cb=quiet,
            closed_cb=self._end_followers,
        )
        if self.person:  # their token, their inbox: the auth callout grants them nothing else
            options.update(token=self.token, inbox_prefix=subjects.person_inbox(self.person))
        if auth["user"]:
            options.update(user=auth["user"], password=auth["password"] or "")
        if auth["creds"]:
            options["user_credentials"] = str(auth["creds"])
        try:  # bounded: against a cluster, nats-py adds the servers it learns to its list at each
            # refused attempt (a wrong password), and would go on trying them for ever
            self._nc = await asyncio.wait_for(nats.connect(**options), CONNECT_DEADLINE)
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            # a refused password is the reason, even when a later attempt only saw the socket reset
            denied = [r for r in refusals if local.denied(str(r))]
            reason = str(denied[-1] if denied else refusals[-1] if refusals else exc) or type(exc).__name__
            how = "person" if self.person else "found" if found else "given" if auth["user"] or auth["creds"] else None
            raise TrialbusError(503, local.refused(self.url, reason, how, self.data_dir)) from None
        self._nc.options["max_reconnect_attempts"] = -1
        self._js = self._nc.jetstream()
        return self

    async def close(self) -> None:
        """Stop the watchers, end the iterators, drain the connection. Safe to call twice."""
        watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            await watcher.stop()
        await self._end_followers()
        if self._nc is not None and not self._nc.is_closed:
            try:
                await self._nc.drain()
            except (OSError, TimeoutError, nats.errors.Error):
                await self._nc.close()

    async def _end_followers(self) -> None:
        for end in list(self._followers):
            end()

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise TrialbusError(503, "the client is not connected: call connect() first")
        return self._js

    # -- the dispatcher's API --------------------------------------------------------------

    async def _call(self, operation: str, body: Mapping[str, Any]) -> Any:
        if self._nc is None:
            raise TrialbusError(503, "the client is not connected: call connect() first")
        if self.person and self.token:  # their door, named by the token they connected with
            subject = subjects.api_as(self.person, token_key(self.token), operation)
        else:
            subject = subjects.api(operation)
        try:
            payload = json.dumps(body).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{operation}: the request is not JSON-serialisable: {exc}") from None
        try:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
            msg = await self._nc.request(subject, payload, timeout=self.request_timeout, headers=headers)
        except nats.errors.NoRespondersError:
            raise TrialbusError(503, f"no dispatcher answers on {subject}; is the stack running?") from None
        except TimeoutError:
            waited = f"{self.request_timeout:g}s"
            raise TrialbusError(504, f"the dispatcher did not answer {operation} in {waited}") from None
        try:
            reply = json.loads(msg.data)
        except ValueError:
            raise TrialbusError(502, f"the dispatcher's answer to {operation} is not JSON") from None
        if not isinstance(reply, dict):
            raise TrialbusError(502, f"the dispatcher's answer to {operation} is not a JSON object")
        if reply.get("ok"):
            return reply.get("result")
        raise TrialbusError(int(reply.get("status") or 500), str(reply.get("error") or "unknown error"))

    async def upload_code(self, directory: str | Path) -> CodeUpload:
        """Pack a code directory and store it unless the store has it; see :mod:`services.common.code`."""
        return await upload_code(self.js, directory)

    async def create_experiment(self, config: ExperimentConfig | Mapping[str, Any] | str | Path) -> str:
        """Create an experiment; its code is packed and uploaded unless ``trialCodeRef`` is set."""
        config = as_config(config)
        if config.trial_code_ref is None:
            upload = await self.upload_code(config.trial_code_directory)
            config = config.model_copy(update={"trial_code_ref": upload.ref})
        body = {"config": config.wire_json()}
        return str((await self._call("experiment.create", body))["id"])

    async def list_experiments(self) -> list[ExperimentView]:
        """Every experiment, newest first."""
        return [_parse(ExperimentView, e) for e in await self._call("experiment.list", {})]

    async def get_experiment(self, experiment_id: str) -> ExperimentView:
        return _parse(ExperimentView, await self._call("experiment.get", {"id": experiment_id}))

    async def list_platforms(self) -> list[PlatformStatus]:
        """Every live adapter replica with its capacity and GPUs."""
        return [_parse(PlatformStatus, p) for p in await self._call("platform.list", {})]

    async def drain_platform(self, adapter: str, replica: str, drain: bool = True) -> dict:
        """Drain an adapter replica (no more trials there; the ones it runs are preempted and run
        again as their next attempt), or with ``drain=False`` let it take trials again;
        ``{replica, draining, preempted}``."""
        return await self._call("platform.drain", {"adapter": adapter, "replica": replica, "drain": drain})

    # -- people -------------------------------------------------------------------------------

    async def whoami(self) -> dict:
        """Who this client's token names: ``{name, team, role}``."""
        return dict(await self._call("whoami", {}))

    async def add_user(self, name: str, team: str, role: str = "member") -> dict:
        """Add a user (admins only); the answer's ``token`` is shown this once."""
        return dict(await self._call("user.add", {"name": name, "team": team, "role": role}))

    async def list_users(self) -> list[dict]:
        return list(await self._call("user.list", {}))

    async def remove_user(self, name: str) -> dict:
        return dict(await self._call("user.remove", {"name": name}))

    async def rotate_token(self, name: str) -> dict:
        """A new token for ``name`` (the answer's ``token``, shown this once); the old one stops working."""
        return dict(await self._call("user.rotate", {"name": name}))

    async def audit(self, limit: int = 100, team: str | None = None) -> list[dict]:
        """The newest ``limit`` changes asked of the dispatcher, oldest first (one team's, or all for an admin)."""
        body: dict[str, Any] = {"limit": limit, **({"team": team} if team else {})}
        return list(await self._call("audit.list", body))

    # -- teams --------------------------------------------------------------------------------

    async def list_teams(self) -> list[dict]:
        """Every team's quota, weight and use of each shared platform (borrowed beyond its quota too)."""
        return list(await self._call("team.list", {}))

    async def set_team(
        self,
        name: str,
        *,
        gpus: float | None = None,
        trials: int | None = None,
        weight: float | None = None,
        platforms: dict[str, dict] | None = None,
    ) -> dict:
        """Set a team's share (admins only); what is left None keeps its value."""
        share = {"gpus": gpus, "trials": trials, "weight": weight, "platforms": platforms}
        return dict(
            await self._call("team.set", {"name": name, "share": {k: v for k, v in share.items() if v is not None}})
        )

    async def remove_team(self, name: str) -> dict:
        return dict(await self._call("team.remove", {"name": name}))

    async def queue(self) -> list[dict]:
        """Each shared platform's waiting experiments in the order they get capacity, and why each waits."""
        return list(await self._call("queue", {}))

    async def stop_experiment(self, experiment_id: str, message: str | None = None) -> ExperimentView:
        """Stop taking trials and cancel the running ones; ``message`` (why) is kept with the
        experiment and its cancelled trials."""
        body = {"id": experiment_id, **({"message": message} if message else {})}
        return _parse(ExperimentView, await self._call("experiment.stop", body))

    async def resume_experiment(self, experiment_id: str) -> ExperimentView:
        """Run a STOPPED experiment again (NNI's resume): it takes trials again, and the tuner service
        drives it again if it has a tuner. A RUNNING one is answered as it is; a DONE one is a 409."""
        return _parse(ExperimentView, await self._call("experiment.resume", {"id": experiment_id}))

    async def import_results(self, experiment_id: str, data: list[Mapping[str, Any]]) -> ExperimentView:
        """Import earlier results (nnictl experiment import): NNI's ``[{"parameter": {...}, "value": n}, ...]``.
        The experiment's tuner learns from them before it proposes; a bad row is a 422 naming it, and then
        nothing is imported. The answer's ``imported`` counts the results imported so far."""
        return _parse(ExperimentView, await self._call("experiment.import", {"id": experiment_id, "data": list(data)}))

    async def update_experiment(self, experiment_id: str, **changes: Any) -> ExperimentUpdate:
        """Change a running experiment (nnictl update): ``trial_concurrency``, ``max_trial_number``,
        ``max_experiment_duration`` (seconds or ``"2h"``) and ``search_space``, or their camelCase
        names; the dispatcher and the tuner service act on it at once. A bad value is a 422 and
        changes nothing; an ended experiment is a 409."""
        body = {"id": experiment_id, "changes": {_camel(name): value for name, value in changes.items()}}
        result = await self._call("experiment.update", body)
        moved = {name: (change.get("from"), change.get("to")) for name, change in result.get("changes", {}).items()}
        return ExperimentUpdate(_parse(ExperimentView, result.get("experiment")), moved)

    async def delete_experiment(self, experiment_id: str) -> int:
        """Delete a stopped or done experiment with its trials, their events and metric records;
        how many trials it had. A running one is refused (409): stop it first."""
        return int((await self._call("experiment.delete", {"id": experiment_id}))["trials"])

    async def submit_trial(
        self, experiment_id: str, parameters: Mapping[str, Any], parameter_id: int | str | None = None
    ) -> SubmittedTrial:
        """Queue a trial; it waits (WAITING) until the experiment has a free slot."""
        body: dict[str, Any] = {"experimentId": experiment_id, "parameters": dict(parameters)}
        if parameter_id is not None:
            body["parameterId"] = parameter_id
        result = await self._call("trial.submit", body)
        trial = SubmittedTrial(str(result["id"]), int(result["sequenceId"]), TrialStatus(result["status"]))
        self._trial_experiment[trial.id] = experiment_id
        return trial

    async def trial_page(
        self,
        experiment_id: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        status: str | TrialStatus | list[TrialStatus | str] | None = None,
        sort: str = "sequence",
    ) -> TrialPage:
        """One page of the experiment's trials (``limit``, default 500, at most 5,000), after
        ``cursor``; ``status`` filters (one or several), ``sort`` is ``sequence`` (submission
        order) or ``metric`` (best final metric first). Only the API view's fields are filled in."""
        body: dict[str, Any] = {"experimentId": experiment_id, "sort": sort}
        if limit is not None:
            body["limit"] = limit
        if cursor is not None:
            body["cursor"] = cursor
        if status is not None:
            body["status"] = status if isinstance(status, str) else ",".join(str(s) for s in status)
        answer = await self._call("trial.list", body)
        trials = [_parse(TrialState, t) for t in answer["trials"]]
        self._trial_experiment.update((t.id, t.experiment_id) for t in trials)
        return TrialPage(trials, answer.get("nextCursor"))

    async def iter_trials(
        self,
        experiment_id: str,
        *,
        status: str | TrialStatus | list[TrialStatus | str] | None = None,
        sort: str = "sequence",
        page_size: int | None = None,
    ) -> AsyncIterator[TrialState]:
        """Every trial of the experiment, a page at a time (see :meth:`trial_page`); in submission
        order no trial is missed or repeated while trials keep ending."""
        cursor = None
        while True:
            page = await self.trial_page(experiment_id, limit=page_size, cursor=cursor, status=status, sort=sort)
            for trial in page.trials:
                yield trial
            if (cursor := page.next_cursor) is None:
                return

    async def list_trials(
        self,
        experiment_id: str,
        *,
        status: str | TrialStatus | list[TrialStatus | str] | None = None,
        sort: str = "sequence",
    ) -> list[TrialState]:
        """The experiment's trials (all of them, read a page at a time; ``status``, ``sort`` as
        :meth:`trial_page`). Only the fields of the API view are filled in."""
        return [trial async for trial in self.iter_trials(experiment_id, status=status, sort=sort)]

    async def get_trial(self, trial_id: str) -> TrialState:
        """One trial. Only the fields of the API view are filled in."""
        trial = _parse(TrialState, await self._call("trial.get", {"id": trial_id}))
        self._trial_experiment[trial.id] = trial.experiment_id
        return trial

    async def cancel_trial(self, trial_id: str, *, early_stop: bool = False, message: str | None = None) -> TrialStatus:
        """Ask for the trial to stop (USER_CANCELED, or EARLY_STOPPED as an assessor's stop when
        ``early_stop``); returns its status at that moment."""
        body: dict[str, Any] = {"id": trial_id}
        if early_stop:
            body["status"] = TrialStatus.EARLY_STOPPED.value
        if message is not None:
            body["message"] = message
        return TrialStatus((await self._call("trial.cancel", body))["status"])

    async def close_experiment(self, experiment_id: str) -> ExperimentView:
        """No more trials will come (NNI's NO_MORE_TRIAL): the experiment is DONE once its trials ended."""
        return _parse(ExperimentView, await self._call("experiment.close", {"id": experiment_id}))

    async def serve_asks(self, experiment_id: str, answer: Callable[[Ask], Awaitable[Answer]]) -> Subscription:
        """Answer the questions the experiment's trials ask through the gateway
        (``asks.<owner>.<experiment>.*``, :mod:`contracts.asks`; docs/optuna.md), one at a time, in order.
        An ask that is no :class:`Ask` is answered with an error. Unsubscribe to stop."""
        if self._nc is None:
            raise TrialbusError(503, "the client is not connected: call connect() first")

        async def handle(msg: Msg) -> None:
            try:
                ask = Ask.decode(msg.data)
            except ContractError as exc:
                await msg.respond(Answer(ok=False, error=f"not an ask: {exc}").encode())
                return
            try:
                reply = (await answer(ask)).encode()
            except Exception as exc:  # an answer that is no JSON: the trial hears why, at once
                reply = Answer(ok=False, error=f"the study's answer cannot be sent: {exc}").encode()
            await msg.respond(reply)

        owner = (await self.get_experiment(experiment_id)).owner
        return await self._nc.subscribe(subjects.asks(owner, experiment_id, "*"), cb=handle)

    async def retry_trial(self, trial_id: str) -> int:
        """Run a trial that has ended again, as its next attempt (same id and parameters); that
        attempt's number. Refused (409) while it runs, or when its experiment is not RUNNING."""
        return int((await self._call("trial.retry", {"id": trial_id}))["attempt"])

    async def trial_metrics(self, trial_id: str) -> list[TrialMetric]:
        return [_parse(TrialMetric, m) for m in await self._call("trial.metrics", {"id": trial_id})]

    async def trial_log(self, trial_id: str, max_bytes: int | None = None, attempt: int | None = None) -> str:
        """The tail of the trial's stdout and stderr (its current attempt's, or ``attempt``'s)."""
        body: dict[str, Any] = {"id": trial_id}
        if max_bytes is not None:
            body["maxBytes"] = max_bytes
        if attempt is not None:
            body["attempt"] = attempt
        return str((await self._call("trial.log", body))["text"])

    # -- streams ---------------------------------------------------------------------------

    def events(self, experiment_id: str, trial_id: str = "*") -> AsyncGenerator[TrialEvent, None]:
        """Every status change of the experiment's trials (or one trial), history first, then live."""
        if trial_id == "*":
            filters = [subjects.experiment_events(experiment_id)]
        else:
            filters = subjects.trial_events(experiment_id, trial_id)
        seen: set[str] = set()  # the stream's own dedupe ids; one per event

        def first_time(e: TrialEvent) -> bool:
            key = subjects.event_id(e.trial_id, e.status.value, e.attempt)
            if key in seen:
                return False
            seen.add(key)
            return True

        return self._unique(stream_name(EVENTS), filters, lambda data: [TrialEvent.decode(data)], first_time)

    def metrics(self, experiment_id: str, trial_id: str = "*") -> AsyncGenerator[MetricRecord, None]:
        """Every metric of the experiment's trials (or one trial), history first, then live; each
        record once (:class:`contracts.metrics.Seen`: memory per trial, not per record)."""
        filters = [subjects.metrics(experiment_id, trial_id)]
        # one record, or a keeper's batch
        return self._unique(stream_name(METRICS), filters, records_of, Seen().first_time)

    def _unique(
        self, stream: str, filters: list[str], decode: Callable[[bytes], list[Any]], first_time: Callable[[Any], bool]
    ) -> AsyncGenerator[Any, None]:
        """Each record once, decoded, history first (:mod:`trialbus.follow`)."""
        payloads = follow(self.js, stream, filters, FOLLOW_BUFFER, self._followers)
        return unique(payloads, " ".join(filters), decode, first_time)

    async def _watcher(self, experiment_id: str) -> ExperimentWatcher:
        async with self._watchers_lock:
            watcher = self._watchers.get(experiment_id)
            if watcher is None or watcher.broken:
                watcher = ExperimentWatcher(self.js, experiment_id, confirm=self.get_trial)
                try:
                    await watcher.start()
                except NotFoundError:
                    await watcher.stop()
                    missing = "streams EVENTS and METRICS do not exist yet; is the stack running?"
                    raise TrialbusError(503, missing) from None
                self._watchers[experiment_id] = watcher
            return watcher

    async def _await(self, trial_id: str, experiment_id: str | None, timeout: float | None, final: bool) -> Any:
        experiment_id = experiment_id or self._trial_experiment.get(trial_id)
        if experiment_id is None:
            experiment_id = (await self.get_trial(trial_id)).experiment_id
        watcher = await self._watcher(experiment_id)
        future = watcher.expect(trial_id, final=final)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            what = "a final metric" if final else "its end"
            raise TimeoutError(f"trial {trial_id} did not report {what} within {timeout:g}s") from None
        finally:
            watcher.forget(trial_id, future)

    async def wait_final(self, trial_id: str, timeout: float | None = None, *, experiment_id: str | None = None) -> Any:
        """The trial's FINAL metric, decoded, as soon as it is reported; None if the trial
        ended without one. Raises TimeoutError after ``timeout`` seconds (None: no limit)."""
        return await self._await(trial_id, experiment_id, timeout, final=True)

    async def wait_trial(
        self, trial_id: str, timeout: float | None = None, *, experiment_id: str | None = None
    ) -> TrialOutcome:
        """Wait until the trial ended; its final status and FINAL metric."""
        return await self._await(trial_id, experiment_id, timeout, final=False)


def _camel(name: str) -> str:
    """``trial_concurrency`` → ``trialConcurrency`` (camelCase names pass as they are)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)
