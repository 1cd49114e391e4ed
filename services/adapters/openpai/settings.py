"""Settings of the openpai adapter: environment ``TRIALBUS_<NAME>``.

The cluster, user, token and share come with each experiment (``trainingService``); these
are the adapter's own.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from services.adapters.base import AdapterSettings


class OpenpaiSettings(AdapterSettings):
    #: Base URL of the metrics gateway as the cluster's containers reach it.
    gateway_url: str = "http://127.0.0.1:8081"
    #: CA bundle (PEM) for clusters with a self-signed HTTPS certificate; unset: the system's.
    #: Certificates are always verified.
    openpai_ca_bundle: Path | None = None
    #: Seconds between two reads of our jobs' states (one list request per cluster and user).
    status_poll: float = Field(default=2.0, gt=0)
    #: Seconds one request to the rest-server may take.
    request_timeout: float = Field(default=30.0, gt=0)
    #: Longest back-off after HTTP 429 (too many submissions) when the server names none.
    rate_limit_backoff: float = Field(default=60.0, gt=0)
    #: Seconds a keeper keeps retrying unsent metrics after its trial ended.
    flush_timeout: float = Field(default=600.0, ge=0)
