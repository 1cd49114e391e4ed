"""The NATS connection every service uses, and the idempotent bootstrap of JetStream.

Guarantees: a connection that drops is reconnected forever; the first connection is
retried with back-off until the server is there; streams, buckets and the object stores
exist (created or updated) before a service starts work.

With per-service NATS users (``k8s/base/nats/auth.conf``) only the dispatcher may create
streams: every other service waits in :func:`bootstrap` until they exist. A service with a
user takes its replies on ``_INBOX_<user>.>``, a prefix no other user may subscribe to, so
nobody reads another service's replies (an adapter's fetched trial requests among them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import APIError, BadRequestError, BucketNotFoundError, NotFoundError, ServiceUnavailableError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from contracts import streams
from contracts.streams import StreamLimits
from services.common.settings import ServiceSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
#: How nats-py words the server's ``-ERR 'Permissions Violation for …'`` (lower-cased).
PERMISSIONS_VIOLATION = "permissions violation"


class Denied(Exception):
    """The server refused this user a publish (a Permissions Violation)."""


@dataclass
class Bus:
    """A connected NATS client with its JetStream context and the shared buckets."""

    nc: Client
    js: JetStreamContext
    #: Called by ``close`` before draining, so the disconnect that follows is not reported.
    on_close: Callable[[], None] = lambda: None
    #: Calls in :meth:`unless_denied`, each told the next Permissions Violation.
    _denials: set[asyncio.Future[str]] = field(default_factory=set, repr=False)

    def denied(self, error: str) -> bool:
        """Pass a Permissions Violation the server reported to the calls awaiting one;
        False when none was (the violation is unexpected)."""
        waiting = [f for f in self._denials if not f.done()]
        for future in waiting:
            future.set_result(error)
        return bool(waiting)

    async def unless_denied(self, call: Awaitable[T]) -> T:
        """Await ``call``; raise :class:`Denied` as soon as the server refuses a publish meanwhile.

        nats-py reports a Permissions Violation to the error callback only: a refused request
        would wait for its timeout. Meant for calls made one at a time (bootstrap).
        """
        denial: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._denials.add(denial)
        task = asyncio.ensure_future(call)
        try:
            await asyncio.wait((task, denial), return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise Denied(denial.result())
        finally:
            self._denials.discard(denial)
            if not task.done():
                task.cancel()

    async def kv(self, bucket: str) -> KeyValue:
        return await self.js.key_value(bucket)

    async def code_store(self) -> ObjectStore:
        return await self.js.object_store(streams.bucket_name(streams.CODE_STORE))

    async def checkpoint_store(self) -> ObjectStore:
        """The remote adapter's copies of checkpoint directories (``streams.CHECKPOINT_STORE``)."""
        return await self.js.object_store(streams.bucket_name(streams.CHECKPOINT_STORE))

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
    bus: Bus | None = None
    refused = False  # the server refused our credentials (reported once)

    async def disconnected() -> None:
        if not closing:
            log.warning("NATS connection lost; reconnecting")

    async def reconnected() -> None:
        log.info("NATS connection re-established")

    async def error(exc: Exception) -> None:
        nonlocal refused
        text = str(exc).lower()
        if PERMISSIONS_VIOLATION in text and not (bus is not None and bus.denied(str(exc))):
            log.warning("NATS refused: %s", exc)  # the server's permissions and this service disagree
        elif "authorization violation" in text and not refused:  # retried forever: said once
            log.error("NATS refused user %r: check TRIALBUS_NATS_USER and TRIALBUS_NATS_PASSWORD", settings.nats_user)
            refused = True
        else:
            log.debug("NATS error: %s", exc)

    options: dict[str, Any] = dict(  # nats.connect's keyword arguments
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
        options["inbox_prefix"] = inbox_prefix(settings.nats_user)
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


def inbox_prefix(user: str) -> str:
    """``_INBOX_<user>``: the reply subjects of a service, which only its user may subscribe to."""
    return "_INBOX_" + "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in user)


#: What JetStream says while it cannot answer yet (a cluster electing its leaders): asked again.
NO_ANSWER = (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError)
#: Seconds the creation of the streams is retried while JetStream does not answer.
BOOTSTRAP_PATIENCE = 60.0


async def bootstrap(bus: Bus | JetStreamContext, replicas: int = 1, limits: StreamLimits | None = None) -> None:
    """Create every stream, bucket and object store that is missing; idempotent. With
    ``limits`` (the dispatcher's, which owns them), existing streams are updated to the
    current definitions and those limits; without, they are left as they are.

    A user the server does not allow to create streams (every service but the dispatcher
    under ``k8s/base/nats/auth.conf``) waits until each exists instead. Without a
    :class:`Bus` a refusal is not noticed (the call times out, as it did before users).
    """
    js = bus.js if isinstance(bus, Bus) else bus
    try:
        # A cluster just started may not answer JetStream requests until it has elected its leaders.
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(NO_ANSWER),
            wait=wait_exponential(max=2),
            stop=stop_after_delay(BOOTSTRAP_PATIENCE),
            reraise=True,
        ):
            with attempt:
                made = _create(js, replicas, limits)
                await (bus.unless_denied(made) if isinstance(bus, Bus) else made)
    except Denied as exc:
        assert isinstance(bus, Bus)  # only a Bus's unless_denied raises Denied
        log.info("this NATS user may not create streams (%s); using those the dispatcher creates", exc)
        await _await_created(bus)


#: JetStream's answer when a stream's byte limit or a new bucket does not fit in its storage.
NO_ROOM = 10047


class NoRoom(RuntimeError):
    """JetStream has no storage left for a stream or bucket: said so the operator can act."""


async def _create(js: JetStreamContext, replicas: int, limits: StreamLimits | None) -> None:
    for config in (dataclasses.replace(c, num_replicas=replicas) for c in streams.STREAMS):
        config = (limits or StreamLimits()).apply(config)
        try:
            await _unless_no_room(config.name or "", js.add_stream(config))
        except BadRequestError:  # it exists: the dispatcher brings it up to date, the others leave it
            if limits is not None:
                await _unless_no_room(config.name or "", js.update_stream(config))
    for bucket in streams.BUCKETS:
        name = streams.bucket_name(bucket)
        try:
            await js.key_value(name)
        except BucketNotFoundError:
            await _unless_no_room(name, js.create_key_value(dataclasses.replace(bucket, replicas=replicas)))
        await _replicate(js, f"KV_{name}", replicas)
    for store in streams.OBJECT_STORES:
        name = streams.bucket_name(store)
        try:
            await js.object_store(name)
        except (NotFoundError, BucketNotFoundError):
            await _unless_no_room(
                name, js.create_object_store(name, config=dataclasses.replace(store, replicas=replicas))
            )
        await _replicate(js, f"OBJ_{name}", replicas)


async def _unless_no_room(name: str, made: Awaitable[Any]) -> None:
    try:
        await made
    except APIError as exc:
        if exc.err_code != NO_ROOM:
            raise
        setting = f" or lower TRIALBUS_{name}_MAX_BYTES" if name in ("EVENTS", "METRICS") else ""
        raise NoRoom(
            f"JetStream has no room for {name}: the nats-server's storage limit (max_file_store, by default "
            f"75 % of its disk's free space when it started) is spent; free disk space on the NATS host and "
            f"restart nats-server, raise max_file_store{setting}"
        ) from None


async def _replicate(js: JetStreamContext, stream: str, replicas: int) -> None:
    """A bucket's stream made before ``stream_replicas`` changed gets the new count."""
    info = await js.stream_info(stream)
    if (info.config.num_replicas or 1) != replicas:
        await js.update_stream(dataclasses.replace(info.config, num_replicas=replicas))


async def _await_created(bus: Bus, poll: float = 1.0) -> None:
    """Return once every stream, bucket and store this user may look at exists.

    One this user may not even look at (a Permissions Violation on its info) is one the
    service does not use: the gateway, say, sees only METRICS.
    """
    missing = [(streams.stream_name(c), f"stream {c.name}") for c in streams.STREAMS]
    missing += [(f"KV_{c.bucket}", f"KV bucket {c.bucket}") for c in streams.BUCKETS]
    missing += [(f"OBJ_{c.bucket}", f"object store {c.bucket}") for c in streams.OBJECT_STORES]
    said: set[str] = set()
    while missing:
        for stream, what in list(missing):
            try:
                await bus.unless_denied(bus.js.stream_info(stream))
            except NotFoundError:
                if what not in said:
                    log.info("waiting for the dispatcher to create %s", what)
                    said.add(what)
                continue
            except NO_ANSWER:
                # JetStream not answering yet (a cluster still electing its leaders): ask again
                if f"{what} (no answer)" not in said:
                    log.info("JetStream does not answer about %s yet; asking again", what)
                    said.add(f"{what} (no answer)")
                continue
            except Denied:
                log.debug("not allowed to look at %s: not waiting for it", what)
            missing.remove((stream, what))
        if missing:
            await asyncio.sleep(poll)
