"""Streams, consumers, KV buckets and the object store, defined once.

``services.common.bus.bootstrap`` creates or updates them idempotently at every
service start, so any service may be the first to come up.
"""

from __future__ import annotations

import dataclasses

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

DAY = 86400.0

DISPATCH = StreamConfig(
    name="DISPATCH",
    description="Trial requests, one work queue per adapter (dispatch.<adapter>)",
    subjects=["dispatch.>"],
    retention=RetentionPolicy.WORK_QUEUE,
    storage=StorageType.FILE,
    duplicate_window=3600.0,
)

EVENTS = StreamConfig(
    name="EVENTS",
    description="Trial status changes, each under its source (events.<experiment>.<trial>.<source>)",
    subjects=["events.>"],
    retention=RetentionPolicy.LIMITS,
    storage=StorageType.FILE,
    max_age=30 * DAY,
    duplicate_window=3600.0,
)

METRICS = StreamConfig(
    name="METRICS",
    description="Trial metric records (metrics.<experiment>.<trial>)",
    subjects=["metrics.>"],
    retention=RetentionPolicy.LIMITS,
    storage=StorageType.FILE,
    max_age=30 * DAY,
    duplicate_window=3600.0,
)

AUDIT = StreamConfig(
    name="AUDIT",
    description="Who did what, when: every change asked of the dispatcher's API (audit.<team>.<action>)",
    subjects=["audit.>"],
    retention=RetentionPolicy.LIMITS,
    storage=StorageType.FILE,
    max_age=365 * DAY,
)

#: The services' log lines about each experiment (the dispatcher's and the tuner's, services/common/buslog.py),
#: for the web UI's Logs view: the last ``LOG_LINES_PER_SUBJECT`` lines of each service per experiment are kept.
LOG_LINES_PER_SUBJECT = 1000
LOGS = StreamConfig(
    name="LOGS",
    description="Services' log lines about an experiment (logs.<experiment>.<service>), the last 1,000 of each",
    subjects=["logs.>"],
    retention=RetentionPolicy.LIMITS,
    storage=StorageType.FILE,
    max_age=30 * DAY,
    max_msgs_per_subject=LOG_LINES_PER_SUBJECT,
    max_bytes=256 * 1024 * 1024,
    max_msg_size=16 * 1024,
)

STREAMS = (DISPATCH, EVENTS, METRICS, AUDIT, LOGS)

EXPERIMENTS_BUCKET = KeyValueConfig(bucket="experiments", history=5, storage=StorageType.FILE)
TRIALS_BUCKET = KeyValueConfig(bucket="trials", history=5, storage=StorageType.FILE)
#: Seconds a platform status lives unless refreshed (the ``ttl`` of PLATFORMS_BUCKET).
PLATFORMS_TTL = 30.0
#: Adapter replicas' :class:`~contracts.messages.PlatformStatus`; an entry a replica stopped
#: refreshing expires after ``ttl`` seconds.
PLATFORMS_BUCKET = KeyValueConfig(bucket="platforms", history=1, ttl=PLATFORMS_TTL, storage=StorageType.FILE)
#: Which tuner replica drives which experiment (key = experiment id, value = replica): a lease the holder
#: refreshes; a replica that dies lets it expire after ``ttl`` seconds and another takes the experiment over.
TUNERS_BUCKET = KeyValueConfig(bucket="tuners", history=1, ttl=15.0, storage=StorageType.FILE)
#: Which adapter replica launched each trial attempt (key ``<adapter>.<trial>.<attempt>``, value = replica):
#: a request delivered again to another replica never starts a second copy (services/adapters/claims.py).
#: A claim only matters until its request is acked (a redelivery comes within the consumer's ack_wait),
#: so entries expire after an hour: the bucket holds the last hour's launches.
CLAIMS_BUCKET = KeyValueConfig(bucket="claims", history=1, ttl=3600.0, storage=StorageType.FILE)
#: People (contracts/people.py): key = user name; a token's hash, never the token.
USERS_BUCKET = KeyValueConfig(bucket="users", history=1, storage=StorageType.FILE)
#: Teams' quotas and weights (contracts/teams.py), key = team; only the dispatcher writes them.
TEAMS_BUCKET = KeyValueConfig(bucket="teams", history=1, storage=StorageType.FILE)
#: Earlier results imported into an experiment (``trialbus experiment import``), key = experiment id, value = the
#: JSON list of NNI's ``{"parameter", "value"}`` rows (services/dispatcher/imports.py); only the dispatcher writes
#: them, the tuner service reads them. Apart from ``experiments`` so that a few thousand rows do not ride along with
#: every write and watch of the experiment's state (which carries only their count).
IMPORTS_BUCKET = KeyValueConfig(bucket="imports", history=1, storage=StorageType.FILE)
BUCKETS = (
    EXPERIMENTS_BUCKET,
    TRIALS_BUCKET,
    PLATFORMS_BUCKET,
    TUNERS_BUCKET,
    CLAIMS_BUCKET,
    USERS_BUCKET,
    TEAMS_BUCKET,
    IMPORTS_BUCKET,
)

CODE_STORE = ObjectStoreConfig(bucket="code", description="trialCodeDirectory snapshots by sha256")
#: The remote adapter's copies of trials' checkpoint directories (a tar.gz each, named
#: ``<experiment>/<trial>``), so that a retry on another SSH machine resumes where the last
#: attempt stopped. An object not written for ``ttl`` seconds expires: a trial retried by hand
#: after that, on another machine, starts without its checkpoint.
CHECKPOINT_STORE = ObjectStoreConfig(
    bucket="checkpoints",
    description="Trials' checkpoint directories (remote adapter), by experiment/trial",
    ttl=7 * DAY,
    storage=StorageType.FILE,
)
OBJECT_STORES = (CODE_STORE, CHECKPOINT_STORE)


def stream_name(config: StreamConfig) -> str:
    """A stream's name: nats.py types it as optional, and every stream defined here has one."""
    if config.name is None:
        raise ValueError(f"stream definition without a name: {config}")
    return config.name


def bucket_name(config: KeyValueConfig | ObjectStoreConfig) -> str:
    """A bucket's or object store's name: optional in nats.py's types, given by every definition here."""
    if config.bucket is None:
        raise ValueError(f"bucket definition without a name: {config}")
    return config.bucket


def adapter_consumer(adapter: str, ack_wait: float = 30.0, max_ack_pending: int = 1000) -> ConsumerConfig:
    """The one durable pull consumer an adapter's replicas share.

    Named (not only durable) so that nats-py creates it on
    ``$JS.API.CONSUMER.CREATE.DISPATCH.adapter-<adapter>.dispatch.<adapter>``: a subject that
    names the filter, which the server checks, so an adapter's NATS user may create only its
    own consumer on its own subject (``k8s/base/nats/auth.conf``).
    """
    return ConsumerConfig(
        name=f"adapter-{adapter}",
        durable_name=f"adapter-{adapter}",
        filter_subject=f"dispatch.{adapter}",
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_ack_pending=max_ack_pending,
        max_deliver=-1,
    )


def dispatcher_consumer(stream: str) -> ConsumerConfig:
    """The dispatcher's durable consumer on EVENTS or METRICS: state is rebuilt from it.

    Acks are cumulative (``AckPolicy.ALL``): one ack after a whole batch is applied and in KV.
    """
    return ConsumerConfig(
        durable_name=f"dispatcher-{stream.lower()}",
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.ALL,
        ack_wait=30.0,
        max_ack_pending=20000,
        max_deliver=-1,
    )


@dataclasses.dataclass(frozen=True)
class StreamLimits:
    """What EVENTS and METRICS keep (the dispatcher's ``TRIALBUS_EVENTS_MAX_AGE`` and the like):
    seconds (0: forever) and bytes (-1: no limit). The oldest messages go first."""

    events_max_age: float = EVENTS.max_age or 0.0
    events_max_bytes: int = -1
    metrics_max_age: float = METRICS.max_age or 0.0
    metrics_max_bytes: int = -1

    def apply(self, config: StreamConfig) -> StreamConfig:
        kept = {
            "EVENTS": (self.events_max_age, self.events_max_bytes),
            "METRICS": (self.metrics_max_age, self.metrics_max_bytes),
        }.get(stream_name(config))
        if kept is None:
            return config
        return dataclasses.replace(config, max_age=kept[0] or None, max_bytes=kept[1])
