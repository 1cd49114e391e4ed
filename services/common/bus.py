"""The NATS connection every service uses, and the idempotent bootstrap of JetStream.

Guarantees: a connection that drops is reconnected forever; the first connection is
retried with back-off until the server is there; streams, buckets and the object store
exist (created or updated) before a service starts work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from contracts import streams
from services.common.settings import ServiceSettings

log = logging.getLogger(__name__)


@dataclass
class Bus:
    """A connected NATS client with its JetStream context and the shared buckets."""

    nc: Client
    js: JetStreamContext
    #: Called by ``close`` before draining, so the disconnect that follows is not reported.
    on_close: Callable[[], None] = lambda: None

    async def kv(self, bucket: str) -> KeyValue:
        return await self.js.key_value(bucket)

    async def code_store(self) -> ObjectStore:
        return await self.js.object_store(streams.CODE_STORE.bucket)

    async def close(self) -> None:
        """Drain: deliver what is buffered, then close. Safe to call twice."""
        self.on_close()
        if not self.nc.is_closed:
            try:
                await self.nc.drain()
            except Exception as exc:  # a connection that is down cannot drain; close it
                log.debug("drain failed (%s); closing", exc)
                await self.nc.close()


async def connect(settings: ServiceSettings, name: str) -> Bus:
    """Connect (retrying until the server answers) with reconnect-forever semantics."""

    closing = False  # set once the service drains: a disconnect then is expected

    async def disconnected() -> None:
        if not closing:
            log.warning("NATS connection lost; reconnecting")

    async def reconnected() -> None:
        log.info("NATS connection re-established")

    async def error(exc: Exception) -> None:
        log.debug("NATS error: %s", exc)

    options = dict(
        servers=[s.strip() for s in settings.nats_url.split(",")],
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=2,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=error,
        drain_timeout=max(1, int(settings.stop_timeout)),
    )
    if settings.nats_user:
        options["user"] = settings.nats_user
        options["password"] = settings.nats_password.get_secret_value() if settings.nats_password else ""
    if settings.nats_creds:
        options["user_credentials"] = str(settings.nats_creds)
    async for attempt in AsyncRetrying(
        wait=wait_exponential(multiplier=0.1, max=5), retry=retry_if_exception_type((OSError, nats.errors.Error))
    ):
        with attempt:
            if attempt.retry_state.attempt_number > 1:
                log.info("waiting for NATS at %s", settings.nats_url)
            nc = await nats.connect(**options)
    bus = Bus(nc=nc, js=nc.jetstream())

    def on_close() -> None:
        nonlocal closing
        closing = True

    bus.on_close = on_close
    return bus


async def bootstrap(js: JetStreamContext) -> None:
    """Create or update every stream, bucket and the object store; idempotent."""
    for config in streams.STREAMS:
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)
    for config in streams.BUCKETS:
        try:
            await js.key_value(config.bucket)
        except BucketNotFoundError:
            await js.create_key_value(config)
    try:
        await js.object_store(streams.CODE_STORE.bucket)
    except (NotFoundError, BucketNotFoundError):
        await js.create_object_store(streams.CODE_STORE.bucket, config=streams.CODE_STORE)
