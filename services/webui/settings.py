"""Web UI settings (environment, prefix ``TRIALBUS_``)."""

from __future__ import annotations

from pydantic import Field

from services.common.auth import AccessSettings


class WebuiSettings(AccessSettings):
    """Who may open it: :class:`~services.common.auth.AccessSettings` (the dispatcher's tokens);
    a page or call needs ``Authorization: Bearer <token>`` or the cookie ``/login?token=`` sets."""

    #: Address the web UI binds to (default 127.0.0.1; loopback only when ``api_auth`` is ``none``).
    webui_host: str = "127.0.0.1"
    #: TCP port of the web UI (default 8082; 0 = any free port).
    webui_port: int = Field(default=8082, ge=0, le=65535)
    #: Seconds between two pushes of an experiment's changes to browsers (default 0.2).
    webui_batch_interval: float = Field(default=0.2, gt=0, le=5)
    #: Seconds between two reads of the adapters' platform status (default 3.0).
    webui_platform_interval: float = Field(default=3.0, gt=0)
    #: Seconds to wait for the dispatcher to answer an action (cancel, stop, log; default 10.0).
    webui_request_timeout: float = Field(default=10.0, gt=0)
