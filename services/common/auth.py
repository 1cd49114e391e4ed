"""Who may call an HTTP service of Trialbus: one authorisation shared by the dispatcher's REST
API and the web UI (the metrics gateway has its own per-trial tokens).

Creating an experiment runs its ``trialCommand`` on our hosts, so these doors are doors to a
shell. Guarantees:

- **A token always.** A service starts only with ``TRIALBUS_API_TOKEN`` set, or with
  ``TRIALBUS_API_AUTH=none`` said explicitly; then it binds loopback only (whatever its host
  setting says) and logs a warning at every start (:func:`bind_host`).
- **Two roles.** The full token may do everything; ``TRIALBUS_API_READ_TOKEN`` (optional) may
  only read (``GET``/``HEAD``): for dashboards and viewers. Tokens are compared in constant time.
- **Browser-safe.** ``Host`` must name this machine (DNS rebinding): ``localhost``, a loopback
  address, the host name, an address of one of its interfaces, or a name in
  ``TRIALBUS_ALLOWED_HOSTS`` (``*`` allows any). A state-changing request that carries an
  ``Origin`` (browsers send it) must come from the same origin or one in
  ``TRIALBUS_ALLOWED_ORIGINS``, the only origins CORS is opened to (none by default). A JSON body
  must say ``Content-Type: application/json`` (:func:`require_content_type`): a cross-site
  "simple" POST (``text/plain``, forms) never reaches a handler.
- Every refusal is an :class:`AccessDenied` with a status (400, 401, 403, 415) and a message
  that says what to send; nothing is read or changed before the check passes.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import logging
import secrets
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode
from starlette.requests import HTTPConnection

from contracts.people import READER, Caller
from services.common.settings import ServiceSettings

log = logging.getLogger(__name__)

Role = Literal["full", "read"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK = "127.0.0.1"
MIN_TOKEN = 16


class AccessDenied(Exception):
    """A request refused before any work: ``status`` and a message a person can act on."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def _names(value: object) -> object:
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


class AccessSettings(ServiceSettings):
    """Who may call: the settings every HTTP service that runs commands or shows state shares."""

    #: The full token: ``Authorization: Bearer <token>`` may do everything. Required unless
    #: ``api_auth`` is ``none``; ``trialbus up`` generates one into ``<data>/api-token``.
    api_token: SecretStr | None = None
    #: A read-only token (optional): ``GET`` and ``HEAD`` only, never a state change.
    api_read_token: SecretStr | None = None
    #: ``token`` (default) or ``none``: no token at all, loopback only, said in the log.
    api_auth: Literal["token", "none"] = "token"
    #: More names this service answers to (the ``Host`` header), comma-separated; ``*`` = any.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Origins (``https://dash.example.com``) a browser may call from; CORS is opened to them only.
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)

    _hosts = field_validator("allowed_hosts", "allowed_origins", mode="before")(_names)

    @field_validator("api_token", "api_read_token", mode="before")
    @classmethod
    def _empty_is_unset(cls, token: object) -> object:  # compose's ``${TRIALBUS_API_READ_TOKEN:-}``
        return None if token == "" else token

    @field_validator("api_token", "api_read_token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < MIN_TOKEN:
            raise ValueError(
                f"a token must have at least {MIN_TOKEN} characters (a guessable token is no token); "
                "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        return token

    @model_validator(mode="after")
    def _one_way(self) -> AccessSettings:
        if self.api_auth == "token" and self.api_token is None:
            raise ValueError(
                "TRIALBUS_API_TOKEN is not set: every caller of this API can run commands on this machine, so "
                "it needs a token (`trialbus up` makes one; or `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`). To run without one on loopback only, set TRIALBUS_API_AUTH=none"
            )
        if self.api_token and self.api_read_token and self.api_token == self.api_read_token:
            raise ValueError("TRIALBUS_API_READ_TOKEN must differ from TRIALBUS_API_TOKEN")
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
                raise ValueError(f"TRIALBUS_ALLOWED_ORIGINS: {origin!r} is not an origin like https://dash.example.com")
        return self


def bind_host(settings: AccessSettings, host: str, service: str) -> str:
    """The address to bind: ``host``, or loopback when the service runs without a token."""
    if settings.api_auth != "none":
        return host
    if not _is_loopback(host):
        log.warning("%s: TRIALBUS_API_AUTH=none, so it binds %s, not %s", service, LOOPBACK, host)
        host = LOOPBACK
    log.warning(
        "%s runs WITHOUT an API token (TRIALBUS_API_AUTH=none): any program or user on this machine "
        "can run commands through it",
        service,
    )
    return host


def session_value(token: str, role: Role) -> str:
    """What the web UI's cookie holds: an HMAC of the token and role, so the cookie is no API credential."""
    return hmac.new(token.encode(), f"trialbus-webui-session:{role}".encode(), hashlib.sha256).hexdigest()


def require_content_type(connection: HTTPConnection, *accepted: str) -> None:
    """The request's body is one of ``accepted`` media types, else 415 naming them."""
    declared = connection.headers.get("content-type", "").partition(";")[0].strip().lower()
    if declared not in accepted:
        raise AccessDenied(
            415, f"send the body with Content-Type: {' or '.join(accepted)}{f', not {declared}' if declared else ''}"
        )


@dataclass(frozen=True)
class Access:
    """The check one HTTP service makes on every request of its protected routes."""

    settings: AccessSettings
    #: How a person gets a credential, for 401 messages ("set TRIALBUS_API_TOKEN", "/login?token=").
    hint: str = "send 'Authorization: Bearer <TRIALBUS_API_TOKEN>' (`trialbus up` keeps it in <data>/api-token)"

    def role(self, connection: HTTPConnection, cookie: str | None = None) -> Role:
        """The caller's role, or :class:`AccessDenied`: Host, then Origin, then the credential."""
        self.check_host(connection)
        if connection.scope.get("method", "GET") not in SAFE_METHODS:
            self.check_origin(connection)
        role = self.credential(connection, cookie)
        if role == "read" and connection.scope.get("method", "GET") not in SAFE_METHODS:
            raise AccessDenied(403, "the read-only token may only read: this needs TRIALBUS_API_TOKEN")
        return role

    def caller(self, connection: HTTPConnection, identify: Callable[[str | None], Caller | None]) -> Caller:
        """Who is asking, or :class:`AccessDenied`: Host, then Origin, then the person the bearer
        token names (``identify``: the stack's tokens and the users'); a viewer only reads."""
        self.check_host(connection)
        unsafe = connection.scope.get("method", "GET") not in SAFE_METHODS
        if unsafe:
            self.check_origin(connection)
        scheme, _, presented = connection.headers.get("authorization", "").partition(" ")
        token = presented.strip() if scheme.lower() == "bearer" and presented.strip() else None
        caller = identify(token)
        if caller is None:
            why = "wrong bearer token" if token else "this needs the API token"
            raise AccessDenied(401, f"{why}: {self.hint}", {"WWW-Authenticate": "Bearer"})
        if unsafe and caller == READER:
            raise AccessDenied(403, "the read-only token may only read: this needs TRIALBUS_API_TOKEN")
        if unsafe and caller.role == "viewer":
            raise AccessDenied(403, f"{caller.name} is a viewer: viewers read, and may not change anything")
        return caller

    def credential(self, connection: HTTPConnection, cookie: str | None = None) -> Role:
        full, read = self._secret(self.settings.api_token), self._secret(self.settings.api_read_token)
        if full is None:
            return "full"  # api_auth none: loopback only
        scheme, _, presented = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and presented.strip():
            role = self.match(presented.strip())
            if role is None:
                raise AccessDenied(401, f"wrong bearer token: {self.hint}", {"WWW-Authenticate": "Bearer"})
            return role
        if cookie is not None:
            offered: tuple[tuple[Role, str | None], ...] = (("full", full), ("read", read))
            for granted, token in offered:
                if token and secrets.compare_digest(cookie.encode(), session_value(token, granted).encode()):
                    return granted
        raise AccessDenied(401, f"this needs the API token: {self.hint}", {"WWW-Authenticate": "Bearer"})

    def match(self, presented: str) -> Role | None:
        """The role of a presented token, or None (both compared, in constant time)."""
        full, read = self._secret(self.settings.api_token), self._secret(self.settings.api_read_token)
        is_full = full is not None and secrets.compare_digest(presented.encode(), full.encode())
        is_read = read is not None and secrets.compare_digest(presented.encode(), read.encode())
        return "full" if is_full else "read" if is_read else None

    def check_host(self, connection: HTTPConnection) -> None:
        host = connection.headers.get("host", "")
        name = _hostname(host)
        if "*" in self.settings.allowed_hosts or name in served_names(tuple(self.settings.allowed_hosts)):
            return
        raise AccessDenied(
            400,
            f"this service does not answer to Host {host!r}: use localhost or this machine's "
            "name or address, or add the name to TRIALBUS_ALLOWED_HOSTS",
        )

    def check_origin(self, connection: HTTPConnection) -> None:
        origin = connection.headers.get("origin")
        if origin is None or origin.rstrip("/") in {o.rstrip("/") for o in self.settings.allowed_origins}:
            return
        parts = urlsplit(origin)
        if parts.netloc and parts.netloc.lower() == connection.headers.get("host", "").lower():
            return
        raise AccessDenied(
            403,
            f"cross-site request from {origin} refused: call from this service's own pages, "
            "or add the origin to TRIALBUS_ALLOWED_ORIGINS",
        )

    @staticmethod
    def _secret(value: SecretStr | None) -> str | None:
        return value.get_secret_value() if value is not None else None


def _hostname(host: str) -> str:
    """``Host`` without its port, lower case, IPv6 brackets removed."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@functools.lru_cache(maxsize=8)
def served_names(extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The names this machine answers to: localhost, loopback, its names and every interface's
    addresses (read once per process), plus ``extra``."""
    names = {"localhost", "127.0.0.1", "::1", *(_hostname(e) for e in extra)}
    for name in (socket.gethostname(), socket.getfqdn()):
        names.add(name.lower())
    names.update(_interface_addresses())
    return frozenset(names)


def _interface_addresses() -> Iterable[str]:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return ()
    return [
        a.address.split("%")[0].lower()
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
    ]
