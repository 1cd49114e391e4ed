"""People: users, their teams and roles, and who may act on what (docs/security.md, "People").

A user is a name, a team and a role; their token is shown once when made and only its
SHA-256 is stored (KV bucket ``users``, key = name). Tokens are 32 random bytes, so a plain
hash is enough: nothing to guess, no dictionary to try, and a lookup by hash is O(1).

Roles, from least to most:

- ``viewer`` reads everything it is shown, and changes nothing;
- ``member`` also creates experiments (owned by them, in their team) and acts on their own
  team's experiments and trials: stop, resume, cancel, retry, delete;
- ``admin`` does everything, on every team's work, and manages users.

:func:`may_act` is that rule, used by every door (REST, the NATS API).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import field_validator

from contracts.base import Contract

Role = Literal["admin", "member", "viewer"]
ROLES: tuple[Role, ...] = ("admin", "member", "viewer")
#: A user's or a team's name: what a person types, safe in a subject, a path and a log line.
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
NAME_RULE = "1 to 32 characters: lower-case letters, digits, '-' and '_', starting with a letter"
#: The team of the built-in users (the token ``trialbus up`` makes, and the read-only token).
ADMIN_TEAM = "admins"


def hash_token(token: str) -> str:
    """What is stored of a token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


#: What every person's token starts with: recognisable in a leak (secret scanners), and told apart
#: from the stack's own tokens without asking anyone.
TOKEN_PREFIX = "tbu_"


def new_token(name: str) -> str:
    """A new user token, ``tbu_<name>.<secret>``: the secret is 32 random bytes, URL-safe (43
    characters, never a dot). The name is no secret; it lets a client say who it connects to
    NATS as (its inbox, ``trialbus.as.<name>``) before anyone answers it (:func:`token_name`)."""
    return f"{TOKEN_PREFIX}{check_name(name, 'user name')}.{secrets.token_urlsafe(32)}"


#: Hex digits of a token's hash in a person's NATS door (:func:`token_key`).
TOKEN_KEY_LENGTH = 16


def token_key(token: str) -> str:
    """What a person's NATS door says of the token their connection was let in with: the start of
    its hash (nothing to learn of the token). A token replaced since opens no door."""
    return hash_token(token)[:TOKEN_KEY_LENGTH]


def token_name(token: str | None) -> str | None:
    """The user a token made by :func:`new_token` names, or None (a stack's token, a user's token
    made before names were in tokens, anything else). Says nothing of whether it is valid."""
    if not token or not token.startswith(TOKEN_PREFIX):
        return None
    name, dot, secret = token.removeprefix(TOKEN_PREFIX).partition(".")
    return name if dot and secret and NAME.match(name) else None


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise ValueError(f"{what} {value!r} is not a valid name: {NAME_RULE}")
    return value


class User(Contract):
    """One person (KV bucket ``users``, key = name)."""

    kind: Literal["user"] = "user"
    v: Literal[1] = 1
    name: str
    team: str
    role: Role
    #: :func:`hash_token` of their token; the token itself is never stored.
    token_hash: str
    created: datetime
    #: When the token was last replaced (``trialbus user rotate``).
    rotated: datetime | None = None

    @field_validator("name", "team")
    @classmethod
    def _named(cls, value: str) -> str:
        return check_name(value, "name")

    def caller(self) -> Caller:
        return Caller(self.name, self.team, self.role)

    def view(self) -> dict[str, str | None]:
        """The REST shape (no hash)."""
        return {
            "name": self.name,
            "team": self.team,
            "role": self.role,
            "created": self.created.isoformat(),
            "rotated": self.rotated.isoformat() if self.rotated else None,
        }


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: a user, or a built-in identity (the stack's tokens)."""

    name: str
    team: str
    role: Role

    def view(self) -> dict[str, str]:
        return {"name": self.name, "team": self.team, "role": self.role}


#: The caller when a service runs without tokens (``TRIALBUS_API_AUTH=none``, loopback only),
#: and of the token ``trialbus up`` makes.
ADMIN = Caller("admin", ADMIN_TEAM, "admin")
#: The caller of the read-only token (``TRIALBUS_API_READ_TOKEN``).
READER = Caller("reader", ADMIN_TEAM, "viewer")


def may_create(caller: Caller) -> str | None:
    """None when ``caller`` may create experiments, else why not."""
    if caller.role == "viewer":
        return f"{caller.name} is a viewer: viewers read, and may not create experiments"
    return None


def may_act(caller: Caller, team: str | None, what: str) -> str | None:
    """None when ``caller`` may change work of ``team`` (None: made before teams, admins only),
    else a message saying why not; ``what`` names the work ("experiment abc", "trial xyz")."""
    if caller.role == "admin":
        return None
    if caller.role == "viewer":
        return f"{caller.name} is a viewer: viewers read, and may not change {what}"
    if team is None:
        return f"{what} has no team (made before teams): only an admin may change it"
    if team != caller.team:
        return f"{what} belongs to team {team}; {caller.name} (team {caller.team}) may change only their team's work"
    return None


def may_manage_users(caller: Caller) -> str | None:
    if caller.role != "admin":
        return f"{caller.name} is a {caller.role}: only an admin may manage users"
    return None


class AuditRecord(Contract):
    """One change asked of the dispatcher (stream ``AUDIT``, subject ``audit.<team>.<action>``):
    who asked, what, on what, and the answer they got."""

    kind: Literal["audit"] = "audit"
    v: Literal[1] = 1
    time: datetime
    user: str
    #: The asker's team and role when they asked.
    user_team: str
    role: Role
    #: ``experiment.create``, ``trial.cancel``, ``user.add``…
    action: str
    #: The experiment, trial or user acted on (None: a create).
    target: str | None = None
    #: The experiment whose work it was (that of the trial acted on), if any.
    experiment: str | None = None
    #: The team whose work it was (None: users, work made before teams).
    team: str | None = None
    #: The HTTP status of the answer: 2xx done, 403 refused, 404…
    status: int
    #: The refusal's or the error's message.
    message: str | None = None
    #: How many times it was done: trials submitted are recorded together, one record per asker and
    #: experiment a second (``time``: the first of them).
    count: int = 1
