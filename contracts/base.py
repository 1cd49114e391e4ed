"""The base of every wire model: frozen, camelCase on the wire, versioned.

``Contract.decode`` is the one place bytes from the bus become a model; a
malformed payload raises :class:`ContractError`, which handlers treat as
permanent (the message is terminated, never redelivered forever).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    PlainSerializer,
    SecretStr,
    SerializationInfo,
    ValidationError,
)
from pydantic.alias_generators import to_camel

#: Serialization context under which :data:`Secret` fields are written in clear: the bus
#: and KV writes only (:meth:`Contract.encode`, ``ExperimentConfig.wire_json``).
REVEAL = {"reveal_secrets": True}


def _secret_json(value: SecretStr, info: SerializationInfo) -> str:
    return value.get_secret_value() if (info.context or {}).get("reveal_secrets") else str(value)


#: A platform secret (password, passphrase, token, key): ``**********`` in repr, logs and
#: every JSON dump (API answers), in clear only on the bus (see :data:`REVEAL`).
Secret = Annotated[SecretStr, PlainSerializer(_secret_json, return_type=str, when_used="json")]

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
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise ContractError(f"invalid {cls.__name__}: {exc}") from exc

    def encode(self) -> bytes:
        """Serialise for the bus (camelCase, ``None`` fields left out, secrets in clear)."""
        return self.model_dump_json(by_alias=True, exclude_none=True, context=REVEAL).encode()

    def to_json(self) -> dict:
        """The JSON-ready dict the REST API answers with."""
        return self.model_dump(mode="json", by_alias=True)


def utcnow() -> datetime:
    """Aware UTC now; every timestamp in Trialbus is aware."""
    return datetime.now(UTC)


Timestamp = AwareDatetime
