"""Fencing attempts: a request delivered again, to another replica, never starts a second copy.

JetStream delivers a trial request to one replica at a time, but *again* when its ack is lost
(a broker restart between launch and ack) or late: the next replica to pull it would start a
second copy of an attempt that already runs. Before launching, a replica therefore *claims*
the attempt in the ``claims`` bucket (key ``<adapter>.<trial>.<attempt>``, value: the
replica) with a create that only one writer can win. Whoever finds the claim taken asks:

- is the holder alive (a fresh status in ``platforms``)? If not, the claim is taken over
  (a compare-and-set on its revision) and the attempt launched here: a replica that died
  while launching must not leave its trial unrun.
- is the attempt running, or over (the trial's state in ``trials``)? Then the request is
  done with (acked): the holder reports the attempt. Otherwise the holder is still
  launching it, or holds it for capacity: the request comes back later.

A replica claims again what it claimed before a restart (same replica name): its own launch
is idempotent. A claim is dropped when the replica gives the request back unlaunched; the
others expire with the bucket (``streams.CLAIMS_BUCKET``), long after any redelivery.
One create per launch is the whole cost when nothing goes wrong.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import nats.errors
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from contracts import ContractError, TrialRequest, TrialState, TrialStatus, streams
from services.common import platforms
from services.common.bus import Bus

log = logging.getLogger(__name__)

#: Seconds before a request whose attempt another live replica is still launching comes back.
RECHECK = 1.0


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """The attempt is another replica's: ``done`` (ack the request) or not yet (nak it, ``RECHECK``)."""

    holder: str
    done: bool
    why: str


@dataclass(frozen=True, slots=True)
class _Buckets:
    """What claims read and write, once started: the bus (the replicas' statuses) and two buckets."""

    bus: Bus
    claims: KeyValue
    trials: KeyValue


class Claims:
    def __init__(self, adapter: str, replica: str) -> None:
        self.adapter, self.replica = adapter, replica
        self._buckets: _Buckets | None = None

    async def start(self, bus: Bus) -> None:
        self._buckets = _Buckets(
            bus, await bus.kv(streams.CLAIMS_BUCKET.bucket), await bus.kv(streams.TRIALS_BUCKET.bucket)
        )

    @property
    def _on(self) -> _Buckets:
        if self._buckets is None:
            raise RuntimeError("the claims are not started")
        return self._buckets

    def key(self, request: TrialRequest) -> str:
        return f"{self.adapter}.{request.trial_id}.{request.attempt}"

    async def take(self, request: TrialRequest) -> Elsewhere | None:
        """Claim the attempt: None when this replica may launch it. Raises ``nats.errors.Error``
        when the bus cannot answer (the caller gives the request back for later)."""
        key, mine = self.key(request), self.replica.encode()
        for _ in range(3):  # a claim dropped or taken over between two reads: look again
            try:
                await self._on.claims.create(key, mine)
                return None
            except KeyWrongLastSequenceError:
                pass
            try:
                entry = await self._on.claims.get(key)
            except NotFoundError:  # given back meanwhile: create again
                continue
            value = entry.value or b""  # optional in nats.py's types: a get's entry always has its data
            holder = value.decode("utf-8", "replace")
            if holder == self.replica or not value:
                return None  # ours, from before a restart: launching is idempotent
            if not await self._alive(holder):
                try:
                    await self._on.claims.update(key, mine, last=entry.revision)
                except KeyWrongLastSequenceError:
                    continue
                log.warning(
                    "attempt %s of trial %s was claimed by replica %s, which is gone: launching it here",
                    request.attempt,
                    request.trial_id,
                    holder,
                )
                return None
            return await self._elsewhere(request, holder)
        raise nats.errors.Error(f"the claim on attempt {request.attempt} keeps changing")

    async def drop(self, key: str) -> None:
        """Give the claim ``key`` up (its request goes back unlaunched), if it is still ours."""
        try:
            entry = await self._on.claims.get(key)
            if entry.value == self.replica.encode():
                await self._on.claims.delete(key, last=entry.revision)
        except nats.errors.Error as exc:  # it expires with the bucket
            log.debug("cannot drop the claim %s: %s", key, exc)

    async def _alive(self, replica: str) -> bool:
        return any(s.replica == replica for s in await platforms.statuses(self._on.bus, self.adapter))

    async def _elsewhere(self, request: TrialRequest, holder: str) -> Elsewhere:
        try:
            trial = TrialState.decode((await self._on.trials.get(request.trial_id)).value or b"")  # b"": unreadable
        except (NotFoundError, ContractError):
            trial = None
        if trial is not None and (trial.attempt > request.attempt or trial.status.terminal):
            return Elsewhere(holder, True, f"attempt {request.attempt} is over")
        if trial is not None and trial.status is TrialStatus.RUNNING:
            return Elsewhere(holder, True, f"attempt {request.attempt} runs on replica {holder}")
        return Elsewhere(holder, False, f"replica {holder} is launching attempt {request.attempt}")
