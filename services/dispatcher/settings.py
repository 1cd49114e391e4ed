"""Dispatcher settings (environment, prefix ``TRIALBUS_``)."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator

from contracts.streams import StreamLimits
from contracts.units import parse_megabytes, parse_seconds_setting
from services.common.auth import AccessSettings


class DispatcherSettings(AccessSettings):
    """Who may call the REST API: :class:`~services.common.auth.AccessSettings`."""

    #: Address the REST API binds to (loopback only when ``api_auth`` is ``none``).
    api_host: str = "127.0.0.1"
    #: REST API port (0 = any free port).
    api_port: int = Field(default=8080, ge=0, le=65535)
    #: The web UI's address as a browser reaches it (``TRIALBUS_WEBUI_URL``, e.g.
    #: ``http://127.0.0.1:8082``), linked from the page at ``/`` (a browser opening the API's
    #: address). ``trialbus up`` sets it to its own web UI; unset, the page says how to find it.
    webui_url: str | None = None
    #: Secret shared with the metrics gateway; trial tokens are HMACs under it. Required.
    trial_secret: SecretStr
    #: Fernet key(s), comma-separated, sealing platform secrets on the bus (the first seals,
    #: all unseal; ``contracts.sealing``); the adapters hold the same. Without it, an
    #: experiment whose config holds a secret (a token, a password, a key) is refused.
    secrets_key: SecretStr | None = None
    #: The NATS auth callout's issuer, an account nkey seed (``SA…``; a secret): with it the
    #: dispatcher answers nats-server's authorization requests, so people connect to NATS with
    #: their own token (services/dispatcher/callout.py); the server's auth.conf names its public
    #: key (``NATS_CALLOUT_ISSUER``). ``trialbus up`` makes the pair. Unset: no callout.
    nats_callout_seed: SecretStr | None = None
    #: Largest JSON body the REST API accepts, in bytes (default 1 MiB).
    api_max_body: int = Field(default=1024 * 1024, gt=0)
    #: Largest code snapshot (tar.gz) accepted by ``POST /api/v1/code``, in bytes (default 300 MiB, as NNI).
    api_max_code: int = Field(default=300 * 1024 * 1024, gt=0)
    #: Seconds to wait for an adapter replica to answer a cancel or log request.
    control_timeout: float = Field(default=2.0, gt=0)
    #: Seconds to wait for an adapter to check a new experiment's platform (SSH connections).
    check_timeout: float = Field(default=20.0, gt=0)
    #: Seconds after its replicas' last status a platform counts as down (hybrid experiments
    #: then send their trials elsewhere); adapters publish their status every 5 s.
    platform_stale_after: float = Field(default=15.0, gt=0)
    #: Seconds a trial's state changed by a metric or by an event other than its end (RUNNING, a
    #: message) waits before it is written to KV (and its batch acked), with the batches that
    #: come meanwhile: a trial that ends within it is written once, with its end. The
    #: dispatcher's own answers (REST, bus API) have it at once; readers of the ``trials``
    #: bucket (the web UI) up to this much later. Ends are written at once.
    state_write_delay: float = Field(default=0.1, ge=0, le=5)
    #: How long the EVENTS and METRICS streams keep a message (``30d``, ``12h``, seconds; 0:
    #: forever) and how much they keep (``50gb``; unset: no limit): the oldest go first.
    #: Applied to the streams at every start of the dispatcher (docs/retention.md).
    events_max_age: float = Field(default=30 * 86400.0, ge=0)
    metrics_max_age: float = Field(default=30 * 86400.0, ge=0)
    events_max_bytes: int | None = Field(default=None, gt=0)
    metrics_max_bytes: int | None = Field(default=None, gt=0)

    _ages = field_validator("events_max_age", "metrics_max_age", mode="before")(parse_seconds_setting)

    @field_validator("events_max_bytes", "metrics_max_bytes", mode="before")
    @classmethod
    def _size(cls, value: object) -> int | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str | int | float):  # refused as parse_megabytes refuses any other value
            raise ValueError(f"bad size {value!r}: use a number with a unit tb, gb, mb, kb or b, e.g. '8gb'")
        return parse_megabytes(value if not str(value).isdigit() else f"{value}b") * 1024 * 1024

    def stream_limits(self) -> StreamLimits:
        return StreamLimits(
            self.events_max_age, self.events_max_bytes or -1, self.metrics_max_age, self.metrics_max_bytes or -1
        )

    @field_validator("nats_callout_seed", mode="before")
    @classmethod
    def _a_seed(cls, seed: object) -> object:
        if seed == "":  # compose's ``${TRIALBUS_NATS_CALLOUT_SEED:-}``: unset
            return None
        if isinstance(seed, str) and not seed.startswith("SA"):
            raise ValueError("TRIALBUS_NATS_CALLOUT_SEED must be an account nkey seed (SA…); `trialbus up` makes one")
        return seed

    @field_validator("webui_url")
    @classmethod
    def _an_address(cls, url: str | None) -> str | None:
        if not url:  # compose's ``${TRIALBUS_WEBUI_URL:-}``: unset
            return None
        if not re.fullmatch(r"https?://[^\s/?#]+(/\S*)?", url):
            raise ValueError(
                f"{url!r} is not an address a browser opens: give http(s)://HOST:PORT, e.g. http://127.0.0.1:8082"
            )
        return url
