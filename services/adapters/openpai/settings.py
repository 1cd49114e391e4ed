"""Settings of the openpai adapter: environment ``TRIALBUS_<NAME>``.

The cluster, user, token and share come with each experiment (``trainingService``); these
are the adapter's own.
"""

from __future__ import annotations

from pydantic import Field, FilePath

from services.adapters.base import AdapterSettings


class OpenpaiSettings(AdapterSettings):
    #: Base URL of the metrics gateway as the cluster's containers reach it.
    gateway_url: str = "http://127.0.0.1:8081"
    #: CA bundle (PEM) for clusters with a self-signed HTTPS certificate; unset: the system's.
    #: Certificates are always verified.
    openpai_ca_bundle: FilePath | None = None
    #: Seconds between two reads of our jobs' states (one list request per cluster and user).
    status_poll: float = Field(default=2.0, gt=0)
    #: Seconds one request to the rest-server may take.
    request_timeout: float = Field(default=30.0, gt=0)
    #: Longest back-off after HTTP 429 (too many submissions) when the server names none.
    rate_limit_backoff: float = Field(default=60.0, gt=0)
    #: Seconds a job may wait in OpenPAI's queue (WAITING) before its trial's message says so.
    queue_note_after: float = Field(default=10.0, ge=0)
    #: Seconds a keeper keeps retrying unsent metrics after its trial ended.
    flush_timeout: float = Field(default=600.0, ge=0)
    #: Reuse mode: seconds between two looks at the share, by the adapter (trials' ends) and by
    #: the environments' runners (new trials).
    reuse_poll: float = Field(default=0.1, gt=0)
    #: Reuse mode: seconds an environment may sit without a trial before the adapter stops it.
    reuse_idle_timeout: float = Field(default=60.0, gt=0)
    #: Reuse mode: seconds an environment's runner waits for word from the adapter (a heartbeat
    #: on the share) before it leaves by itself, so no job outlives an adapter that never returns.
    reuse_orphan_timeout: float = Field(default=600.0, gt=0)
