"""The metrics gateway: trial keepers POST NNI metric records over HTTP; it publishes them.

Each record becomes a :class:`contracts.MetricRecord` on ``metrics.<experiment>.<trial>``
with ``Nats-Msg-Id: <trial>:<type>:<sequence>``, so a keeper's retries are deduplicated by
JetStream. A batch is answered 200 only once every record in it is acked by the stream.
The protocol (answers and what the keeper does with them) is docs/internals.md §2.
"""
