"""Users, tokens and the two 401s (rest-server ``middlewares/token.js``, ``controllers/v2/authn``).

Tokens look like JWTs (three base64url parts, HMAC-signed) but the emulator only trusts the
ones it issued and has not revoked. Login tokens and application tokens never expire here.
Application tokens work as ``Bearer <token>`` or ``Basic base64(<user>:<token>)`` and only for
job operations; any other endpoint answers 403.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field


class ApiError(Exception):
    """An error answer: ``{"code": code, "message": message}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


GUEST = "Guest is not allowed to do this operation."
INVALID = "Your token is invalid."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Caller:
    """Who made a request, from its token."""

    user: str
    admin: bool
    application: bool
    token: str


@dataclass
class Auth:
    """The user table (from the CLI) and every token issued so far."""

    passwords: dict[str, str]
    admins: set[str]
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _tokens: dict[str, tuple[str, bool]] = field(default_factory=dict)  # token -> (user, application)

    def issue(self, user: str, application: bool) -> str:
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        claims = {"username": user, "application": application, "iat": int(time.time()), "jti": secrets.token_hex(8)}
        payload = _b64(json.dumps(claims).encode())
        signature = _b64(hmac.new(self._key, f"{header}.{payload}".encode(), hashlib.sha256).digest())
        token = f"{header}.{payload}.{signature}"
        self._tokens[token] = (user, application)
        return token

    def login(self, username: object, password: object, expiration: object) -> dict[str, object]:
        """``POST /api/v2/authn/basic/login`` (Joi validation, then the user lookup)."""
        if not isinstance(username, str) or not username:
            raise ApiError(400, "InvalidParametersError", '"username" is required')
        if not re.fullmatch(r"[\w.-]+", username):
            raise ApiError(
                400,
                "InvalidParametersError",
                f'"username" with value "{username}" fails to match the required pattern: /^[\\w.-]+$/',
            )
        if not isinstance(password, str) or not password:
            raise ApiError(400, "InvalidParametersError", '"password" is required')
        if len(password) < 6:
            raise ApiError(400, "InvalidParametersError", '"password" length must be at least 6 characters long')
        if expiration is not None:
            try:
                seconds = int(str(expiration))
            except ValueError:
                raise ApiError(400, "InvalidParametersError", '"expiration" must be a number') from None
            if not 60 <= seconds <= 604800:
                raise ApiError(400, "InvalidParametersError", '"expiration" must be between 60 and 604800')
        if username not in self.passwords:
            raise ApiError(400, "NoUserError", f"User {username} is not found.")
        if not hmac.compare_digest(self.passwords[username], password):
            raise ApiError(400, "IncorrectPasswordError", "Password is incorrect.")
        token = self.issue(username, application=False)
        return {"user": username, "token": token, "admin": username in self.admins, "hasGitHubPAT": False}

    def check(self, authorization: str | None, allow_application: bool) -> Caller:
        """The caller of a request with this ``Authorization`` header, or the 401/403 the server gives."""
        if not authorization:
            raise ApiError(401, "UnauthorizedUserError", GUEST)
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() == "bearer":
            token, claimed = credentials, None
        elif scheme.lower() == "basic":
            try:
                claimed, _, token = base64.b64decode(credentials, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise ApiError(401, "UnauthorizedUserError", INVALID) from None
        else:
            raise ApiError(401, "UnauthorizedUserError", INVALID)
        owner = self._tokens.get(token)
        if owner is None or (claimed is not None and (claimed != owner[0] or not owner[1])):
            raise ApiError(401, "UnauthorizedUserError", INVALID)
        user, application = owner
        if application and not allow_application:
            raise ApiError(403, "ForbiddenUserError", "Applications are not allowed to do this operation.")
        return Caller(user=user, admin=user in self.admins, application=application, token=token)

    def tokens_of(self, user: str) -> list[str]:
        return [t for t, (owner, _) in self._tokens.items() if owner == user]

    def revoke(self, caller: Caller, token: str) -> None:
        owner = self._tokens.get(token)
        if owner is not None and owner[0] != caller.user and not caller.admin:
            raise ApiError(403, "ForbiddenUserError", f"User {caller.user} is not allowed to revoke this token.")
        self._tokens.pop(token, None)
