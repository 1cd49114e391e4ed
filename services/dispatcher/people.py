"""The people who may use this Trialbus: users (KV bucket ``users``), who is asking, and the
audit trail of what they asked (stream ``AUDIT``). A part of the dispatcher's core.

- **Who is asking.** :meth:`People.identify` maps a token to a :class:`~contracts.people.Caller`:
  the stack's own tokens (``TRIALBUS_API_TOKEN``: the first admin; ``TRIALBUS_API_READ_TOKEN``:
  a viewer), else a user's, looked up by its SHA-256 (O(1); only digests are compared, so
  the time a comparison takes tells at most how much of a guess's digest matches, which leads
  to no token). The table is read once at start and kept by this process, the only writer.
- **Who may act.** :meth:`People.acting` wraps each change: the rule of
  :func:`contracts.people.may_act` on the team of the work changed, a 403 with its message when
  refused, and an :class:`~contracts.people.AuditRecord` of every attempt, done or refused (trials
  submitted by the thousand are recorded together: one record per asker and experiment a second,
  with their count, :data:`BATCHED`).
- **Users.** Only an admin adds, lists, removes users and replaces their token; a token is
  answered once, when made, and only its hash is stored.

Reading the audit trail reads at most :data:`AUDIT_WINDOW` records back from the newest
(O(window) per read, whatever the stream's size).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from contracts import streams, subjects
from contracts.base import ContractError, utcnow
from contracts.people import (
    ADMIN,
    READER,
    ROLES,
    TOKEN_KEY_LENGTH,
    AuditRecord,
    Caller,
    User,
    check_name,
    hash_token,
    may_act,
    may_create,
    may_manage_users,
    new_token,
)
from services.common import kvwatch
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher.settings import DispatcherSettings

log = logging.getLogger(__name__)

#: The most records a read of the audit trail looks at, newest first.
AUDIT_WINDOW = 10_000
#: The team of an audit record about no team's work (users; work made before teams).
NO_TEAM = "_"
#: Actions done by the thousand (a tuner's submits): recorded together, one record per asker,
#: experiment and action each :meth:`People.flush` (a second), with their ``count``; refusals at once.
BATCHED = frozenset({"trial.submit"})


@dataclass(slots=True)
class Whose:
    """What an audited change was on: filled in as the change learns it."""

    target: str | None = None
    experiment: str | None = None
    team: str | None = None
    #: What was done, for the record of a change that succeeded ("imported 20 results"); None: nothing to add.
    note: str | None = None


class People:
    """Users, identification, the permission check and the audit trail (module docstring)."""

    def __init__(self, settings: DispatcherSettings, bus: Bus, team_of: Callable[[str], str | None]) -> None:
        self._bus = bus
        #: The team of an experiment by id (404 when there is none): what a change is checked against.
        self._team_of = team_of
        self._admin = settings.api_token.get_secret_value() if settings.api_token else None
        self._reader = settings.api_read_token.get_secret_value() if settings.api_read_token else None
        self._by_name: dict[str, User] = {}
        self._by_hash: dict[str, User] = {}
        #: (asker, action, experiment, team) → [when the first was done, how many] (:data:`BATCHED`)
        self._done: dict[tuple[Caller, str, str | None, str | None], list] = {}

    async def load(self) -> None:
        """Read the users bucket (once, at start)."""
        for entry in await kvwatch.current(self._bus, streams.bucket_name(streams.USERS_BUCKET)):
            try:
                self._keep(User.decode(entry.value))
            except ContractError as exc:
                log.warning("ignoring the unreadable user %s: %s", entry.key, exc)

    # ---------------------------------------------------------------- who is asking

    def identify(self, token: str | None) -> Caller | None:
        """The caller a token names, or None (no such token). Without stack tokens
        (``TRIALBUS_API_AUTH=none``, loopback only) every caller is the admin."""
        if self._admin is None:
            return ADMIN
        if token is None:
            return None
        digest = hash_token(token)
        if digest == hash_token(self._admin):
            return ADMIN
        if self._reader is not None and digest == hash_token(self._reader):
            return READER
        user = self._by_hash.get(digest)
        return user.caller() if user else None

    def person(self, token: str | None) -> Caller | None:
        """The user a token is the token of, or None: users only, never the stack's tokens, and
        whatever ``TRIALBUS_API_AUTH`` says (the NATS auth callout: a connection is a person's
        or refused). O(1)."""
        user = self._by_hash.get(hash_token(token)) if token else None
        return user.caller() if user else None

    def named(self, name: str) -> Caller | None:
        """The user called ``name`` as they are now (team, role), or None: removed."""
        user = self._by_name.get(name)
        return user.caller() if user else None

    def at_door(self, name: str, key: str) -> Caller | None:
        """The user called ``name`` if ``key`` (:func:`~contracts.people.token_key`) is their
        current token's, else None: removed, or their token replaced since. O(1)."""
        user = self._by_name.get(name)
        return user.caller() if user and user.token_hash[:TOKEN_KEY_LENGTH] == key else None

    # ---------------------------------------------------------------- who may act

    @contextlib.asynccontextmanager
    async def acting(
        self, caller: Caller, action: str, *, experiment_id: str | None = None, target: str | None = None
    ) -> AsyncIterator[Whose]:
        """Check that ``caller`` may do ``action`` on the experiment (its team), or create one
        (no ``experiment_id``), then run the body; the attempt is audited, done or refused. A
        create says what it made: ``whose.experiment = state.id``."""
        async with self.audited(caller, action, target or experiment_id, experiment_id) as whose:
            if experiment_id is not None:
                whose.team = self._team_of(experiment_id)
                refusal = may_act(caller, whose.team, f"experiment {experiment_id}")
            else:  # a create: the work will be the caller's team's
                whose.team = caller.team
                refusal = may_create(caller)
            if refusal:
                raise ApiError(403, refusal)
            yield whose

    @contextlib.asynccontextmanager
    async def audited(
        self, caller: Caller, action: str, target: str | None, experiment_id: str | None = None
    ) -> AsyncIterator[Whose]:
        """Record the body's outcome: 200, or the status and message of its :class:`ApiError`.
        The body fills in whose work it was when it learns it (:class:`Whose`)."""
        whose = Whose(target, experiment_id)
        try:
            yield whose
        except ApiError as exc:
            await self.record(caller, action, whose, exc.status, exc.message)
            raise
        await self.record(caller, action, whose, 200, whose.note)

    async def record(self, caller: Caller, action: str, whose: Whose, status: int, message: str | None = None) -> None:
        if status == 200 and action in BATCHED:  # O(1): published with the others of its second
            done = self._done.setdefault((caller, action, whose.experiment, whose.team), [utcnow(), 0])
            done[1] += 1
            return
        await self._publish(caller, action, whose, status, message)

    async def flush(self) -> None:
        """Publish the records of :data:`BATCHED` actions done since the last flush (the sweep's, once a
        second, and the service's stop). O(askers × experiments that submitted)."""
        done, self._done = self._done, {}
        for (caller, action, experiment, team), (when, count) in done.items():
            await self._publish(caller, action, Whose(experiment, experiment, team), 200, None, count, when)

    async def _publish(
        self,
        caller: Caller,
        action: str,
        whose: Whose,
        status: int,
        message: str | None = None,
        count: int = 1,
        when: datetime | None = None,
    ) -> None:
        team = whose.team
        record = AuditRecord(
            time=when or utcnow(),
            user=caller.name,
            user_team=caller.team,
            role=caller.role,
            action=action,
            target=whose.target or whose.experiment,
            experiment=whose.experiment,
            team=team,
            status=status,
            message=message,
            count=count,
        )
        try:
            await self._bus.js.publish(subjects.audit(team or NO_TEAM, action), record.encode())
        except (nats.errors.Error, TimeoutError) as exc:  # the change is done; say that its record is lost
            log.error("could not record %s by %s in the audit trail: %s", action, caller.name, exc)

    async def audit(
        self, caller: Caller, limit: int = 100, team: str | None = None, experiment: str | None = None
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` records (oldest first), of one team's work or all (admins see
        every team's, others their own team's), of one experiment's work or all."""
        if not 1 <= limit <= 1000:
            raise ApiError(422, "limit must be between 1 and 1000")
        if caller.role != "admin":
            if team not in (None, caller.team):
                raise ApiError(403, f"{caller.name} (team {caller.team}) may read only their team's audit trail")
            team = caller.team
        if team is not None:
            check_team(team)
        subject = subjects.audit(team or "*", ">")  # an action has dots of its own (trial.cancel)
        info = await self._bus.js.stream_info(streams.stream_name(streams.AUDIT))
        if info.state.messages == 0:
            return []
        start = max(info.state.first_seq, info.state.last_seq - AUDIT_WINDOW + 1)
        sub = await self._bus.js.subscribe(
            subject,
            stream=streams.stream_name(streams.AUDIT),
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start),
        )
        found: list[dict[str, Any]] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=1)
                except nats.errors.TimeoutError:
                    break
                record = AuditRecord.decode(msg.data)
                if experiment is None or record.experiment == experiment:
                    found.append(record.to_json())
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        # by time: a batch of submits is published after its second, with the time of the first
        found.sort(key=lambda r: datetime.fromisoformat(r["time"]))
        return found[-limit:]

    # ---------------------------------------------------------------- users

    def users(self, caller: Caller) -> list[dict[str, Any]]:
        _admin_only(caller)
        return [user.view() for user in sorted(self._by_name.values(), key=lambda u: u.name)]

    async def add(self, caller: Caller, name: Any, team: Any, role: Any = "member") -> dict[str, Any]:
        """A new user; the answer holds their token, which is never shown again."""
        async with self.audited(caller, "user.add", name if isinstance(name, str) else None):
            return await self._add(caller, name, team, role)

    async def _add(self, caller: Caller, name: Any, team: Any, role: Any) -> dict[str, Any]:
        _admin_only(caller)
        name, team = check_user(name), check_team(team)
        if role not in ROLES:
            raise ApiError(422, f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if name in (ADMIN.name, READER.name) or name in self._by_name:
            raise ApiError(409, f"user {name} exists; remove them first or rotate their token")
        token = new_token(name)
        user = User(name=name, team=team, role=role, token_hash=hash_token(token), created=utcnow())
        kv = await self._bus.kv(streams.bucket_name(streams.USERS_BUCKET))
        try:
            await kv.create(name, user.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            raise ApiError(409, f"user {name} exists; remove them first or rotate their token") from None
        self._keep(user)
        log.info("user %s added to team %s as %s by %s", name, team, role, caller.name)
        return {**user.view(), "token": token}

    async def remove(self, caller: Caller, name: str) -> dict[str, Any]:
        async with self.audited(caller, "user.remove", name):
            _admin_only(caller)
            user = self._user(name)
            await (await self._bus.kv(streams.bucket_name(streams.USERS_BUCKET))).delete(name)
            self._forget(user)
            log.info("user %s removed by %s", name, caller.name)
            return user.view()

    async def rotate(self, caller: Caller, name: str) -> dict[str, Any]:
        """A new token for ``name``; the old one stops working at once."""
        async with self.audited(caller, "user.rotate", name):
            _admin_only(caller)
            user = self._user(name)
            token = new_token(name)
            rotated = user.model_copy(update={"token_hash": hash_token(token), "rotated": utcnow()})
            await (await self._bus.kv(streams.bucket_name(streams.USERS_BUCKET))).put(name, rotated.encode())
            self._forget(user)
            self._keep(rotated)
            log.info("token of user %s replaced by %s", name, caller.name)
            return {**rotated.view(), "token": token}

    def _user(self, name: str) -> User:
        user = self._by_name.get(name)
        if user is None:
            raise ApiError(404, f"no user {name!r}; `trialbus user list` shows them")
        return user

    def _keep(self, user: User) -> None:
        self._by_name[user.name] = user
        self._by_hash[user.token_hash] = user

    def _forget(self, user: User) -> None:
        self._by_name.pop(user.name, None)
        self._by_hash.pop(user.token_hash, None)


def _admin_only(caller: Caller) -> None:
    if refusal := may_manage_users(caller):
        raise ApiError(403, refusal)


def check_user(name: Any) -> str:
    try:
        return check_name(name, "user name")
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None


def check_team(name: Any) -> str:
    try:
        return check_name(name, "team")
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
