"""Who is using the web UI: the stack's two tokens, or a person's own (docs/security.md, "People").

The stack's tokens are checked here, as before (:class:`~services.common.auth.Access`). A
person's token is the dispatcher's to know: the web UI asks it (``whoami`` with the token, over
its NATS API) and remembers the answer for :data:`REMEMBER` seconds, so a removed user or a
rotated token stops working within that time. Logging in with one opens a server-side
session: the cookie holds a random session id, not the token, and the session keeps the
token in this process's memory only, to send with the person's actions: the dispatcher then
checks them as that person and records them in the audit trail under their name. Sessions end
after :data:`SESSION_HOURS`, or when the web UI restarts (log in again).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from contracts.people import TOKEN_PREFIX, Caller, hash_token
from services.webui.actions import Dispatcher, Refused

#: Seconds a person's token is taken as the dispatcher last said.
REMEMBER = 30.0
SESSION_HOURS = 12
#: Sessions kept at most (the oldest go first): a bound on what logins can make this process hold.
MAX_SESSIONS = 10_000
#: What a person's session cookie starts with (the stack tokens' cookies are HMACs, never this).
PREFIX = "u."


@dataclass(frozen=True, slots=True)
class Person:
    """A person and their token (None for the stack's own tokens: actions go without one)."""

    caller: Caller
    token: str | None


class People:
    """Who a person's token names (asked of the dispatcher, remembered briefly), and their sessions."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        #: token hash -> (person, until when it is believed)
        self._known: dict[str, tuple[Person, float]] = {}
        #: session id -> (person, expiry), oldest first
        self._sessions: OrderedDict[str, tuple[Person, float]] = OrderedDict()

    async def identify(self, token: str) -> Person | None:
        """The person ``token`` names, or None (not a person's token, or the dispatcher does not know it)."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest, now = hash_token(token), time.monotonic()
        known = self._known.get(digest)
        if known is not None and known[1] > now:
            return known[0]
        try:
            me = await self._dispatcher.call("whoami", {}, token)
        except Refused as exc:
            if exc.status == 401:
                self._known.pop(digest, None)
                return None
            raise
        person = Person(Caller(str(me["name"]), str(me["team"]), me["role"]), token)
        if len(self._known) >= MAX_SESSIONS:
            self._known.clear()  # rare: many distinct tokens; asking again is cheap
        self._known[digest] = (person, now + REMEMBER)
        return person

    def open(self, person: Person) -> str:
        """A new session for ``person``: the cookie's value."""
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.popitem(last=False)
        session = secrets.token_urlsafe(32)
        self._sessions[session] = (person, time.monotonic() + SESSION_HOURS * 3600)
        return PREFIX + session

    async def of_cookie(self, cookie: str) -> Person | None:
        """The person of a session cookie, checked again with the dispatcher (a removed user's
        session ends within :data:`REMEMBER` seconds); None when unknown or ended."""
        entry = self._sessions.get(cookie.removeprefix(PREFIX))
        if entry is None or entry[1] < time.monotonic():
            self._sessions.pop(cookie.removeprefix(PREFIX), None)
            return None
        token = entry[0].token
        return await self.identify(token) if token else entry[0]
