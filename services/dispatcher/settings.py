"""Dispatcher settings (environment, prefix ``TRIALBUS_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from services.common.auth import AccessSettings


class DispatcherSettings(AccessSettings):
    """Who may call the REST API: :class:`~services.common.auth.AccessSettings`."""

    #: Address the REST API binds to (loopback only when ``api_auth`` is ``none``).
    api_host: str = "127.0.0.1"
    #: REST API port (0 = any free port).
    api_port: int = Field(default=8080, ge=0, le=65535)
    #: Secret shared with the metrics gateway; trial tokens are HMACs under it. Required.
    trial_secret: SecretStr
    #: Fernet key(s), comma-separated, sealing platform secrets on the bus (the first seals,
    #: all unseal; ``contracts.sealing``); the adapters hold the same. Without it, an
    #: experiment whose config holds a secret (a token, a password, a key) is refused.
    secrets_key: SecretStr | None = None
    #: Largest JSON body the REST API accepts, in bytes (default 1 MiB).
    api_max_body: int = Field(default=1024 * 1024, gt=0)
    #: Largest code snapshot (tar.gz) accepted by ``POST /api/v1/code``, in bytes (default 300 MiB, as NNI).
    api_max_code: int = Field(default=300 * 1024 * 1024, gt=0)
    #: Seconds to wait for an adapter replica to answer a cancel or log request.
    control_timeout: float = Field(default=2.0, gt=0)
    #: Seconds to wait for an adapter to check a new experiment's platform (SSH connections).
    check_timeout: float = Field(default=20.0, gt=0)
