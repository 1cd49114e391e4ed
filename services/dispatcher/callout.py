"""The NATS auth callout: who a NATS connection that is no service is, and what it may do. A part
of the dispatcher, the only holder of the users table (docs/security.md, "People").

nats-server (``k8s/base/nats/auth.conf``: ``auth_callout``) lets the services' users in by their
passwords and asks on ``$SYS.REQ.USER.AUTH`` about every other connection: a signed
*authorization request* (a JWT) with what the client sent when it connected. :class:`Callout`
answers each with an *authorization response* signed by the stack's callout issuer (an account
nkey; the server knows its public half): a user JWT for a person, or an error, and the server
refuses the connection. Guarantees:

- **A person's token or nothing.** The token comes from the connect options (``auth_token``, or
  ``pass`` with ``user`` = their name) and must be a user's (:meth:`People.person`): the stack's
  own tokens, a wrong or removed user's token, no token, are refused. O(1) per connect.
- **What a person may do on the bus** (:func:`permissions`): publish their API door,
  ``trialbus.as.<name>.<key>.>``, ``key`` naming the token they connected with (the dispatcher
  then knows who asks from the subject, and refuses a token replaced since: :mod:`.bus_api`),
  store code snapshots, read the EVENTS and METRICS streams (the client's ``events()``,
  ``metrics()``, ``wait_final()``); subscribe to their own inbox ``_INBOX_as.<name>.>`` and to
  their own experiments' trials' questions, ``asks.<name>.*.*`` (``trialbus.optuna.optimize``
  answers them: one answer each, on the asker's inbox), and nothing else. Never
  ``trialbus.api.>`` (a header-less call there is the stack's admin), never another person's
  door, inbox or questions.
- Nothing here logs a token or the issuer's seed.

Only nats-server can publish on ``$SYS.REQ.USER.AUTH`` (no user of auth.conf may, nor a person),
and its answer goes to the server's reply subject; a request's signature is still checked
against the server key it names, so a malformed request is dropped, never answered.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts import subjects
from contracts.people import Caller, token_key

log = logging.getLogger(__name__)

#: Where nats-server sends its authorization requests.
AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
#: The audience of an authorization request (nats-server's ``AuthRequestSubject``).
REQUEST_AUDIENCE = "nats-authorization-request"
#: The account a person is placed in: the global one, where JetStream and the services are.
ACCOUNT = "$G"
HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}

#: What a person's connection may publish besides their API door: the reads and the code
#: uploads of trialbus.async_client (the same grants as auth.conf's ``client`` user, which
#: tests/integration/test_nats_permissions.py shows are the ones nats-py uses).
READS = (
    # upload_code(): the object store `code` (a snapshot is named by its content's hash)
    "$O.code.C.>",
    "$O.code.M.>",
    "$JS.API.STREAM.INFO.OBJ_code",
    "$JS.API.STREAM.MSG.GET.OBJ_code",
    # events() / metrics() / wait_trial() / wait_final(): ordered consumers, a trial's last metric
    "$JS.API.STREAM.INFO.EVENTS",
    "$JS.API.CONSUMER.CREATE.EVENTS",
    "$JS.FC.EVENTS.>",
    "$JS.API.STREAM.INFO.METRICS",
    "$JS.API.CONSUMER.CREATE.METRICS",
    "$JS.FC.METRICS.>",
    "$JS.API.STREAM.MSG.GET.METRICS",
)


class CalloutError(ValueError):
    """An authorization request that is not one (malformed, or not signed by the server it names)."""


def permissions(name: str, token: str) -> dict[str, Any]:
    """The NATS permissions of person ``name`` let in with ``token``, as a user JWT says them
    (module docstring)."""
    return {
        "pub": {"allow": [subjects.api_as(name, token_key(token), ">"), *READS]},
        "sub": {"allow": [subjects.person_inbox(name) + ".>", subjects.asks(name, "*", "*")]},
        "resp": {"max": 1, "ttl": 0},  # the answer to each ask received (0: the server's default expiry)
    }


class Callout:
    """Answers nats-server's authorization requests on ``nc`` as the issuer whose nkey seed is
    ``seed``; ``person`` maps a token to its user (:meth:`People.person`)."""

    def __init__(self, nc: NatsClient, seed: str, person: Callable[[str | None], Caller | None]) -> None:
        self._nc = nc
        self._issuer = nkeys.from_seed(seed.encode())
        self._person = person
        self._sub: Subscription | None = None

    @property
    def issuer(self) -> str:
        """The issuer's public key: auth.conf's ``auth_callout.issuer``."""
        return self._issuer.public_key.decode()

    async def start(self) -> None:
        # a queue group: with several dispatchers connected, one answers each request
        self._sub = await self._nc.subscribe(AUTH_SUBJECT, queue="dispatcher", cb=self._on_request)
        log.info("NATS auth callout: people connect with their token (issuer %s)", self.issuer)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_request(self, msg: Msg) -> None:
        answer = self.answer(msg.data)
        if answer is not None and msg.reply:
            await msg.respond(answer)

    def answer(self, request: bytes) -> bytes | None:
        """The signed authorization response to ``request``; None when it is no request (dropped:
        the server then refuses the connection when it gives up waiting)."""
        try:
            claims = decode(request.decode(), nkeys.PREFIX_BYTE_SERVER)
            asked = claims["nats"]
            user_nkey, server = str(asked["user_nkey"]), str(asked["server_id"]["id"])
            if claims.get("aud") != REQUEST_AUDIENCE or claims.get("iss") != server:
                raise CalloutError("not an authorization request of the server that signed it")
        except (CalloutError, KeyError, TypeError, UnicodeDecodeError) as exc:
            log.warning("dropping a malformed authorization request: %s", exc)
            return None
        options = asked.get("connect_opts") or {}
        token = options.get("auth_token") or options.get("pass") or None
        caller = self._person(token)
        if caller is not None and options.get("user") and options["user"] != caller.name:
            caller = None  # a user name that is not the token's: one of the two is wrong
        if caller is None:
            client = asked.get("client_info") or {}
            log.info(
                "NATS connection from %s refused: %s",
                client.get("host", "?"),
                "a wrong or removed user's token" if token else "no credential",
            )
            outcome: dict[str, Any] = {"error": "a Trialbus user's token is needed (`trialbus user add` gives one)"}
        else:
            assert token is not None  # a person's
            outcome = {"jwt": self._user_jwt(caller.name, token, user_nkey)}
        outcome |= {"type": "authorization_response", "version": 2}
        return encode({"aud": server, "sub": user_nkey, "nats": outcome}, self._issuer).encode()

    def _user_jwt(self, name: str, token: str, user_nkey: str) -> str:
        limits = {"subs": -1, "data": -1, "payload": -1}  # no limits beyond the account's (nats-io/jwt's default)
        user = {**permissions(name, token), **limits, "type": "user", "version": 2}
        return encode({"aud": ACCOUNT, "sub": user_nkey, "name": name, "nats": user}, self._issuer)


def new_issuer() -> tuple[str, str]:
    """A new callout issuer: (its seed, its public key), an account nkey pair."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)
    return seed.decode(), nkeys.from_seed(seed).public_key.decode()


# -- JWTs as nats-io/jwt writes them: base64url (no padding) header.claims.signature, ed25519


def encode(claims: dict[str, Any], issuer: nkeys.KeyPair) -> str:
    """``claims`` issued now by ``issuer``, signed."""
    claims = {**claims, "iss": issuer.public_key.decode(), "iat": int(time.time())}
    # the JWT's id: a hash of its claims, as nats-io/jwt makes it (the server does not check it)
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode().rstrip("=")
    signed = f"{_b64(json.dumps(HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signed}.{_b64(issuer.sign(signed.encode()))}"


def decode(token: str, prefix: int) -> dict[str, Any]:
    """The claims of ``token``, whose signature is checked against its issuer, a key of ``prefix``."""
    try:
        header, body, signature = token.strip().split(".")
        if json.loads(_unb64(header)).get("alg") != HEADER["alg"]:
            raise CalloutError("not an nkey-signed JWT")
        claims = json.loads(_unb64(body))
        key = base64.b32decode(str(claims["iss"]))  # prefix byte, 32 key bytes, crc16
        if len(key) != 35 or key[0] != prefix:
            raise CalloutError("issued by a key of the wrong kind")
        VerifyKey(key[1:33]).verify(f"{header}.{body}".encode(), _unb64(signature))
    except CalloutError:
        raise
    except (ValueError, KeyError, AttributeError, BadSignatureError) as exc:
        raise CalloutError(f"unreadable or badly signed JWT ({type(exc).__name__})") from None
    if not isinstance(claims, dict):
        raise CalloutError("a JWT's claims are a JSON object")
    return claims


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
