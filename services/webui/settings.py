"""Web UI settings (environment, prefix ``TRIALBUS_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from services.common.settings import ServiceSettings


class WebuiSettings(ServiceSettings):
    #: Address the web UI binds to (default 127.0.0.1); keep it unless ``api_token`` is set.
    webui_host: str = "127.0.0.1"
    #: TCP port of the web UI (default 8082; 0 = any free port).
    webui_port: int = Field(default=8082, ge=0, le=65535)
    #: When set (the dispatcher's TRIALBUS_API_TOKEN), every page and call needs
    #: ``Authorization: Bearer <token>`` or the cookie that ``/login?token=<token>`` sets.
    api_token: SecretStr | None = Field(default=None, min_length=1)
    #: Seconds between two pushes of an experiment's changes to browsers (default 0.2).
    webui_batch_interval: float = Field(default=0.2, gt=0, le=5)
    #: Seconds between two reads of the adapters' platform status (default 3.0).
    webui_platform_interval: float = Field(default=3.0, gt=0)
    #: Seconds to wait for the dispatcher to answer an action (cancel, stop, log; default 10.0).
    webui_request_timeout: float = Field(default=10.0, gt=0)
