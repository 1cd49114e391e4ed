"""Tuner service settings (environment, prefix ``TRIALBUS_``)."""

from __future__ import annotations

import socket

from pydantic import Field

from contracts import streams
from services.common.settings import ServiceSettings
from services.tuner.history import DEFAULT_KEEP_LAST


class TunerSettings(ServiceSettings):
    #: This replica's name in the ``tuners`` leases (default: the host name; a StatefulSet pod's name is stable).
    replica: str = Field(default_factory=socket.gethostname, min_length=1)
    #: Seconds between two refreshes of the leases (default 5); a lease lives ``TUNERS_BUCKET.ttl`` (15 s).
    tuner_lease_refresh: float = Field(default=5.0, gt=0, lt=streams.TUNERS_BUCKET.ttl)
    #: Seconds to wait for the dispatcher to answer a submit, cancel or close (default 10).
    tuner_api_timeout: float = Field(default=10.0, gt=0)
    #: Port of ``/healthz`` and ``/metrics`` (Prometheus); none served when unset (compose and Kubernetes set 9090).
    tuner_http_port: int | None = Field(default=None, ge=0, le=65535)
    #: Address the health and metrics endpoints bind to.
    tuner_http_host: str = "127.0.0.1"
    #: Finished trials a built-in tuner learns from, per experiment: the last ones, besides the 25 best (default
    #: 1,000; :mod:`services.tuner.history`). TPE's cost per proposal and the tuner's memory grow with it.
    tuner_history: int = Field(default=DEFAULT_KEEP_LAST, ge=1)
