"""The base of every wire model: frozen, camelCase on the wire, versioned.

``Contract.decode`` is the one place bytes from the bus become a model; a
malformed payload raises :class:`ContractError`, which handlers treat as
permanent (the message is terminated, never redelivered forever). Platform secrets
(:data:`Secret`) are sealed by ``encode`` and unsealed by ``decode`` where this process
holds the key (:mod:`contracts.sealing`).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated, Any, Self

import orjson
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    SecretStr,
    SerializationInfo,
    ValidationError,
    ValidationInfo,
)
from pydantic.alias_generators import to_camel

from contracts import sealing

#: Serialization context of everything written to the bus (:meth:`Contract.encode`, KV
#: puts): :data:`Secret` fields are written sealed (:mod:`contracts.sealing`).
REVEAL = {"reveal_secrets": True}
#: Serialization context of a config a user sends to the dispatcher (``ExperimentConfig.wire_json``):
#: secrets in clear, as the user wrote them; only the dispatcher's API takes it, never a stream.
CLEAR = {"clear_secrets": True}
#: Validation context of a payload read from the bus (:meth:`Contract.decode`): the only
#: place a sealed value is accepted.
FROM_BUS = {"from_bus": True}

#: Why a user may not give a sealed value: it would make an adapter decrypt someone
#: else's secret for them (and send it to a host of their choosing).
SEALED_FROM_USER = (
    f"a sealed value ({sealing.PREFIX}…) is accepted only from the bus, not from users: give the secret itself"
)


def _secret_in(value: Any, info: ValidationInfo) -> Any:
    """Clear values pass; a sealed one is unsealed when read from the bus with a key, kept
    sealed without one (whoever needs it says so: ``sealing.unreadable``), refused elsewhere."""
    if not sealing.is_sealed(value):
        return value
    if not (info.context or {}).get("from_bus"):
        raise ValueError(SEALED_FROM_USER)
    if sealing.installed():
        try:
            return sealing.unseal(value.get_secret_value() if isinstance(value, SecretStr) else value)
        except sealing.SealingError:
            pass  # a wrong key: kept sealed, and the adapter that needs it fails the trial with why
    return value


def _secret_json(value: SecretStr, info: SerializationInfo) -> str:
    context = info.context or {}
    clear = value.get_secret_value()
    if context.get("reveal_secrets"):
        return clear if sealing.is_sealed(clear) else sealing.seal(clear)
    return clear if context.get("clear_secrets") else str(value)


def _token_json(value: SecretStr, info: SerializationInfo) -> str:
    clear = value.get_secret_value()
    if (info.context or {}).get("reveal_secrets"):
        return sealing.seal(clear) if sealing.installed() and not sealing.is_sealed(clear) else clear
    return str(value)


#: A platform secret (password, passphrase, token, key): ``**********`` in repr, logs and
#: every JSON dump (API answers); sealed on the bus (see :data:`REVEAL`), which needs a key:
#: writing one from a process without any raises :class:`~contracts.sealing.SealingError`.
#: A value already sealed is written as it is, so a process without the key passes it through.
Secret = Annotated[
    SecretStr, BeforeValidator(_secret_in), PlainSerializer(_secret_json, return_type=str, when_used="json")
]

#: A trial's credential at the metrics gateway: as :data:`Secret`, but written in clear on
#: the bus by a dispatcher without a key (it lets a trial report for itself only, and an
#: experiment with no platform secret needs no key).
TrialToken = Annotated[
    SecretStr, BeforeValidator(_secret_in), PlainSerializer(_token_json, return_type=str, when_used="json")
]

#: Readers forbid unknown fields when this is set (tests), and ignore them otherwise,
#: so that a newer writer never breaks an older reader in production.
STRICT = os.environ.get("TRIALBUS_CONTRACTS_STRICT", "") not in ("", "0", "false")


class ContractError(ValueError):
    """A payload does not match its contract; retrying it cannot help."""


class Contract(BaseModel):
    """A frozen wire model: camelCase JSON, python names in code."""

    model_config = ConfigDict(
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid" if STRICT else "ignore",
        ser_json_inf_nan="constants",
    )

    @classmethod
    def decode(cls, raw: bytes | str) -> Self:
        """Parse a payload from the bus; raise ContractError with the reason."""
        try:
            return cls.model_validate_json(raw, context=FROM_BUS)
        except ValidationError as exc:
            raise ContractError(f"invalid {cls.__name__}: {exc}") from exc

    def encode(self) -> bytes:
        """Serialise for the bus (camelCase, ``None`` fields left out, secrets sealed)."""
        return self.model_dump_json(by_alias=True, exclude_none=True, context=REVEAL).encode()

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict the REST API answers with."""
        return self.model_dump(mode="json", by_alias=True)


def peek(raw: bytes, field: str) -> str | None:
    """The string ``field`` of a message's JSON object, read without validating the rest (a reader
    that only routes or skips messages); None when unreadable or not a string."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    found = value.get(field) if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


def utcnow() -> datetime:
    """Aware UTC now; every timestamp in Trialbus is aware."""
    return datetime.now(UTC)


Timestamp = AwareDatetime
