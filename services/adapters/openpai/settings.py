"""Settings of the openpai adapter: environment ``TRIALBUS_<NAME>``.

The cluster, user, token and share come with each experiment (``trainingService``); these
are the adapter's own.
"""

from __future__ import annotations

from pydantic import Field, FilePath

from services.adapters.sharefs import ShareSettings


class OpenpaiSettings(ShareSettings):
    """Besides the shared ones (gateway URL, flush timeout, request timeout, queue note)."""

    #: CA bundle (PEM) for clusters with a self-signed HTTPS certificate; unset: the system's.
    #: Certificates are always verified.
    openpai_ca_bundle: FilePath | None = None
    #: Seconds between two reads of our jobs' states (one list request per cluster and user).
    status_poll: float = Field(default=2.0, gt=0)
    #: Seconds between two reads of a cluster's virtual clusters' GPUs (one request per cluster
    #: and user; the first on the client's first use): what teams' quotas on ``openpai/<vc>`` share.
    openpai_vc_refresh: float = Field(default=60.0, gt=0)
    #: Longest back-off after HTTP 429 (too many submissions) when the server names none.
    rate_limit_backoff: float = Field(default=60.0, gt=0)
    #: Reuse mode: seconds between two looks at the share, by the adapter (trials' ends) and by
    #: the environments' runners (new trials).
    reuse_poll: float = Field(default=0.1, gt=0)
    #: Reuse mode: seconds an environment may sit without a trial before the adapter stops it.
    reuse_idle_timeout: float = Field(default=60.0, gt=0)
    #: Reuse mode: seconds an environment's runner waits for word from the adapter (a heartbeat
    #: on the share) before it leaves by itself, so no job outlives an adapter that never returns.
    reuse_orphan_timeout: float = Field(default=600.0, gt=0)
