"""Dispatcher settings (environment, prefix ``TRIALBUS_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from services.common.settings import ServiceSettings


class DispatcherSettings(ServiceSettings):
    #: Address the REST API binds to; keep 127.0.0.1 unless ``api_token`` is set.
    api_host: str = "127.0.0.1"
    #: REST API port (0 = any free port).
    api_port: int = Field(default=8080, ge=0, le=65535)
    #: When set, every REST call needs ``Authorization: Bearer <token>``.
    api_token: SecretStr | None = None
    #: Secret shared with the metrics gateway; trial tokens are HMACs under it. Required.
    trial_secret: SecretStr
    #: Largest JSON body the REST API accepts, in bytes (default 1 MiB).
    api_max_body: int = Field(default=1024 * 1024, gt=0)
    #: Largest code snapshot (tar.gz) accepted by ``POST /api/v1/code``, in bytes (default 300 MiB, as NNI).
    api_max_code: int = Field(default=300 * 1024 * 1024, gt=0)
    #: Seconds to wait for an adapter replica to answer a cancel or log request.
    control_timeout: float = Field(default=2.0, gt=0)
    #: Seconds to wait for an adapter to check a new experiment's platform (SSH connections).
    check_timeout: float = Field(default=20.0, gt=0)
