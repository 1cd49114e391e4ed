"""Platform secrets sealed on the bus: Fernet under ``TRIALBUS_SECRETS_KEY``.

Guarantees:

- **Never in clear on the bus.** A platform secret (OpenPAI token, SSH password, key and
  passphrase, OpenPAI job secrets) that a contract writes to the bus is ``sealed:v1:<Fernet
  token>`` (AES-128-CBC + HMAC-SHA256, authenticated: a changed value is refused, never
  half-read). Sealing without a key raises :class:`SealingError`; nothing falls back to clear.
- **Only key holders read them.** The dispatcher and the adapters :func:`install` the key at
  start; clients, the web UI, the tuner and the gateway hold none, so what they read from
  the bus stays sealed (and masked, ``**********``) and what they write back passes
  through unchanged.
- **Keys.** A Fernet key (``python -m contracts.sealing``), or any random string of 32
  characters or more (``openssl rand -hex 32``, as every other secret), whose SHA-256 is used.
- **Rotation without downtime.** ``TRIALBUS_SECRETS_KEY`` lists one or more keys,
  comma-separated: the first seals, every one unseals (``MultiFernet``). Put a new key
  first on the dispatcher and every adapter and restart them; drop the old key once the
  experiments that were running have ended (the dispatcher re-seals an experiment's state
  with the first key whenever it writes it).
- **Errors say what to set, never the secret or the key.**

A sealed value is accepted only from the bus, never from a user (``contracts.base``): a
copy of someone's sealed token cannot be handed to the dispatcher to make an adapter
decrypt it and send it to a host of the user's choosing.

``python -m contracts.sealing`` prints a new key.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import BaseModel, SecretStr

#: What every sealed value starts with (the version of the format).
PREFIX = "sealed:v1:"
#: The setting that holds the keys, as people set it.
ENV = "TRIALBUS_SECRETS_KEY"

#: Why a secret cannot be sealed here (the dispatcher's answer when an experiment needs it).
NO_KEY = (
    f"this service has no {ENV}: platform secrets cannot be written to the bus in clear; "
    "set the same key on the dispatcher and the adapters"
)
#: Why a sealed value cannot be read here: no key, or not the key it was sealed with.
NO_KEY_TO_UNSEAL = f"this service has no {ENV}; set it to the dispatcher's key"
WRONG_KEY = (
    f"it was sealed with a key this service's {ENV} does not hold (or it is damaged); set {ENV} to "
    "the dispatcher's key (during a rotation: the new key first, then the old one)"
)

#: A key that is not a Fernet key is a random string at least this long (``openssl rand -hex 32``,
#: as for every other secret of a deployment): its SHA-256 becomes the Fernet key.
MIN_SECRET = 32

#: The keys of this process: None until :func:`install` is given one.
_keys: MultiFernet | None = None


def _derived(secret: str) -> bytes:
    return base64.urlsafe_b64encode(hashlib.sha256(b"trialbus-secrets-key\0" + secret.encode()).digest())


class SealingError(ValueError):
    """A secret cannot be sealed or unsealed here; the message says which key to set."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        #: Why a value cannot be unsealed (:data:`NO_KEY_TO_UNSEAL`, :data:`WRONG_KEY`).
        self.reason = reason or message


def install(keys: str | None) -> int:
    """Use ``keys`` (comma-separated Fernet keys, the first seals) in this process; None or
    an empty string removes them. Called once at start by the dispatcher and the adapters.
    Returns how many keys are installed; raises SealingError for a key that is not one."""
    global _keys
    parts = [part.strip() for part in (keys or "").split(",") if part.strip()]
    fernets = []
    for i, part in enumerate(parts, 1):
        try:
            fernets.append(Fernet(part))
        except (ValueError, TypeError):
            if len(part) < MIN_SECRET:
                raise SealingError(
                    f"{ENV}: key {i} of {len(parts)} is neither a Fernet key (32 url-safe base64-encoded bytes) nor a "
                    f"random string of {MIN_SECRET} characters or more; make one with `python -m contracts.sealing` "
                    "or `openssl rand -hex 32`"
                ) from None
            fernets.append(Fernet(_derived(part)))
    _keys = MultiFernet(fernets) if fernets else None
    return len(fernets)


def installed() -> bool:
    """Whether this process holds a key (can seal and unseal)."""
    return _keys is not None


def generate_key() -> str:
    """A new random key, as ``TRIALBUS_SECRETS_KEY`` takes it."""
    return Fernet.generate_key().decode()


def is_sealed(value: Any) -> bool:
    """Whether ``value`` (a string or a SecretStr) is a sealed value."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    return isinstance(value, str) and value.startswith(PREFIX)


def seal(clear: str) -> str:
    """``clear`` sealed under the first key; SealingError (:data:`NO_KEY`) without a key."""
    if _keys is None:
        raise SealingError(NO_KEY)
    return PREFIX + _keys.encrypt(clear.encode()).decode()


def unseal(value: str) -> str:
    """The clear text of a sealed value; SealingError without a key or with the wrong one."""
    if not is_sealed(value):
        raise SealingError(f"not a sealed value (sealed values start with {PREFIX})")
    if _keys is None:
        raise SealingError(f"a platform secret cannot be unsealed: {NO_KEY_TO_UNSEAL}", NO_KEY_TO_UNSEAL)
    try:
        return _keys.decrypt(value[len(PREFIX) :].encode()).decode()
    except (InvalidToken, UnicodeError):
        raise SealingError(f"a platform secret cannot be unsealed: {WRONG_KEY}", WRONG_KEY) from None


def secret_values(obj: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(path, value)`` of every secret in a model (nested models, lists and dicts): its
    SecretStr fields, and the sealed strings inside its lists and dicts (job templates).
    Paths are camelCase, as in the config (``trainingService.machineList.0.password``)."""
    if isinstance(obj, BaseModel):
        for name, field in type(obj).model_fields.items():
            yield from secret_values(getattr(obj, name), _join(path, field.alias or name))
    elif isinstance(obj, SecretStr):
        yield path, obj.get_secret_value()
    elif isinstance(obj, dict | list | tuple):
        for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
            if isinstance(value, str) and is_sealed(value):
                yield _join(path, str(key)), value
            else:
                yield from secret_values(value, _join(path, str(key)))


def unreadable(obj: Any) -> str | None:
    """Why a secret in ``obj`` (a trial request, a training service) cannot be read here, or
    None when every one is clear: what an adapter reports instead of using a sealed value."""
    for path, value in secret_values(obj):
        if not is_sealed(value):
            continue
        try:
            unseal(value)
        except SealingError as exc:
            return f"{path} cannot be unsealed: {exc.reason}"
        return f"{path} was read from the bus before this service installed its {ENV}"
    return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


if __name__ == "__main__":
    print(generate_key())
