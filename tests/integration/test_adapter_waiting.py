"""The adapter service's ``Waiting`` flow, with a fake adapter over a real nats-server.

An adapter raises :class:`~services.adapters.errors.Waiting` when the platform has no
room yet; the service holds the request (unacked, outside ``launch_concurrency``),
publishes WAITING with the reason, offers it again when capacity frees, and hands it
back to the queue after ``wait_hold``. What comes out is read from the EVENTS stream and
the ``platforms`` bucket, as the dispatcher and ``GET /api/v1/platforms`` see them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest
from nats.js.errors import KeyDeletedError, KeyNotFoundError

from contracts import CancelReply, CancelRequest, PlatformStatus, TrialRequest, TrialStatus, subjects
from contracts.base import utcnow
from services.adapters.errors import Waiting
from services.adapters.fake import FakeAdapter, FakePlatform
from tests.integration import test_adapter_service
from tests.integration.test_adapter_service import Stack, statuses

#: The bus as the dispatcher sees it, and the replicas under test (the fixture of test_adapter_service).
stack = test_adapter_service.stack

REASON = "waiting for a free slot on the fake platform"


class Crowded(FakeAdapter):
    """A fake platform with ``slots`` free slots: a launch takes one, or raises Waiting when none
    is free. Requests with ``{"fits": true}`` always fit. The test frees slots with :meth:`free`."""

    def __init__(self, platform: FakePlatform | None = None, slots: int = 0) -> None:
        super().__init__(platform or FakePlatform())
        self.slots = slots
        self.launches: Counter[str] = Counter()  # launch calls per trial

    async def launch(self, request: TrialRequest):
        self.launches[request.trial_id] += 1
        key = f"{request.trial_id}:{request.attempt}"
        parameters = json.loads(request.parameter_record)["parameters"]
        if key not in self.platform.runs and not parameters.get("fits"):
            if self.slots <= 0:
                raise Waiting(REASON)
            self.slots -= 1
        return await super().launch(request)

    def free(self, slots: int = 1) -> None:
        self.slots += slots
        self.capacity_freed()


def waiting_events(stored, trial: str) -> list[tuple[str, object]]:
    return [(i, e) for i, e in stored if e.trial_id == trial and e.status is TrialStatus.WAITING]


async def until_waiting(stack: Stack, *trials: str, timeout: float = 5.0) -> None:
    await stack.until(lambda events: all(TrialStatus.WAITING in statuses(events, t) for t in trials), timeout)


async def until_launched(adapter: Crowded, trial: str, calls: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while adapter.launches[trial] < calls:
        assert time.monotonic() < deadline, f"{trial} offered {adapter.launches[trial]} times, wanted {calls}"
        await asyncio.sleep(0.01)


async def test_a_waiting_request_says_why_once_and_runs_as_soon_as_capacity_frees(stack: Stack) -> None:
    adapter = Crowded(slots=0)
    await stack.replica(adapter, wait_hold=30)  # held for the whole test: no hand-back
    await stack.submit("patient", duration=0.1)
    await until_waiting(stack, "patient")

    # Offered again on every capacity signal, still full: the reason is not published again
    for round_ in range(3):
        adapter.capacity_freed()
        await until_launched(adapter, "patient", round_ + 2)
    assert adapter.launches["patient"] >= 4
    (msg_id, waiting), *more = waiting_events(await stack.events(), "patient")
    assert more == []
    assert msg_id.startswith("patient:WAITING:0:")
    assert (waiting.message, waiting.platform, waiting.replica, waiting.attempt) == (REASON, "fake", "r1", 0)

    # When a slot frees, the held request runs at once
    freed, began = utcnow(), time.monotonic()
    adapter.free()
    events = await stack.until(lambda events: TrialStatus.RUNNING in statuses(events, "patient"))
    seen = time.monotonic() - began
    running = next(e for e in events if e.trial_id == "patient" and e.status is TrialStatus.RUNNING)
    latency = (running.time - freed).total_seconds()
    print(f"freeing -> RUNNING: {latency * 1000:.1f} ms (event time), {seen * 1000:.1f} ms (seen on the stream)")
    assert 0 <= latency < 0.3
    ended = await stack.until_ended("patient")
    assert ended["patient"].status is TrialStatus.SUCCEEDED
    assert statuses(await stack.until(bool), "patient") == [
        TrialStatus.WAITING,
        TrialStatus.RUNNING,
        TrialStatus.SUCCEEDED,
    ]
    assert adapter.platform.starts == {"patient": 1}
    queue = await stack.dispatch_queue()
    assert (queue.num_pending, queue.num_ack_pending) == (0, 0)


async def test_held_requests_do_not_block_a_request_that_fits(stack: Stack) -> None:
    adapter = Crowded(slots=0)
    await stack.replica(adapter, launch_concurrency=2, wait_hold=30)
    held = ["held1", "held2", "held3"]
    for trial in held:
        await stack.submit(trial, duration=0.1)
    await until_waiting(stack, *held)  # 3 held although only 2 launches may be in flight

    began = time.monotonic()
    await stack.submit("fits", fits=True)
    ended = await stack.until_ended("fits")
    print(f"a request that fits, behind 3 held ones: ended {time.monotonic() - began:.3f}s after submit")
    assert time.monotonic() - began < 1.0
    assert ended["fits"].status is TrialStatus.SUCCEEDED
    events = await stack.until(bool)
    assert all(statuses(events, trial) == [TrialStatus.WAITING] for trial in held)
    assert set(adapter.platform.starts) == {"fits"}


@pytest.mark.parametrize("room", ["none", "freed silently"])
async def test_a_cancel_ends_a_held_request_and_it_never_launches(stack: Stack, room: str) -> None:
    adapter = Crowded(slots=0)
    service = await stack.replica(adapter, wait_hold=30)
    await stack.submit("doomed", duration=60)
    await until_waiting(stack, "doomed")
    if room == "freed silently":  # room came without a capacity_freed(): the cancel's wake-up must not launch it
        adapter.slots = 1

    raw = await stack.bus.nc.request(
        subjects.control("fake", "cancel"), CancelRequest(experiment_id="exp1", trial_id="doomed").encode(), timeout=2
    )
    ended = await stack.until_ended("doomed")

    reply = CancelReply.decode(raw.data)
    assert (reply.accepted, reply.replica) == (True, "r1")
    assert ended["doomed"].status is TrialStatus.USER_CANCELED
    assert statuses(await stack.until(bool), "doomed") == [TrialStatus.WAITING, TrialStatus.USER_CANCELED]
    adapter.free()  # room now: the canceled request is not offered again
    await asyncio.sleep(0.3)
    assert "doomed" not in adapter.platform.starts
    assert service.owned == {}
    queue = await stack.dispatch_queue()
    assert (queue.num_pending, queue.num_ack_pending) == (0, 0)  # acked: it ends here


async def test_after_wait_hold_another_replica_with_room_takes_it(stack: Stack) -> None:
    full = Crowded(slots=0)  # full forever
    await stack.replica(full, replica="r1", wait_hold=0.5)
    await stack.submit("mover", duration=0.1)
    await until_waiting(stack, "mover")  # r1 holds it
    roomy = Crowded(slots=10)
    await stack.replica(roomy, replica="r2", wait_hold=0.5)

    ended = await stack.until_ended("mover", timeout=10)

    events = await stack.until(bool)
    running = next(e for e in events if e.trial_id == "mover" and e.status is TrialStatus.RUNNING)
    assert (running.replica, ended["mover"].replica, ended["mover"].status) == ("r2", "r2", TrialStatus.SUCCEEDED)
    assert statuses(events, "mover") == [TrialStatus.WAITING, TrialStatus.RUNNING, TrialStatus.SUCCEEDED]
    assert (full.platform.starts, roomy.platform.starts) == ({}, {"mover": 1})


async def test_stopping_while_holding_hands_the_request_to_the_next_replica(stack: Stack) -> None:
    full = Crowded(slots=0)
    first = await stack.replica(full, replica="r1", wait_hold=30)
    await stack.submit("orphan", duration=0.1)
    await until_waiting(stack, "orphan")

    began = time.monotonic()
    await stack.stop(first)
    took = time.monotonic() - began
    print(f"stop while holding: {took:.3f}s")
    assert took < first.settings.stop_timeout

    roomy = Crowded(slots=1)
    await stack.replica(roomy, replica="r2", wait_hold=30)
    ended = await stack.until_ended("orphan", timeout=10)
    assert (ended["orphan"].status, ended["orphan"].replica) == (TrialStatus.SUCCEEDED, "r2")
    assert (full.platform.starts, roomy.platform.starts) == ({}, {"orphan": 1})


async def test_a_request_held_at_stop_gives_its_claim_up_so_any_replica_takes_it_at_once(stack: Stack) -> None:
    first = await stack.replica(Crowded(slots=0), replica="r1", wait_hold=30)
    await stack.submit("held", duration=0.1)
    await until_waiting(stack, "held")
    claims = await stack.bus.kv("claims")
    assert (await claims.get("fake.held.0")).value == b"r1"  # claimed while it waits

    await stack.stop(first)

    with pytest.raises((KeyNotFoundError, KeyDeletedError)):  # never launched: nothing left to fence
        await claims.get("fake.held.0")


async def test_the_platforms_bucket_shows_held_requests_and_is_cleared_on_stop(stack: Stack) -> None:
    adapter = Crowded(slots=0)
    service = await stack.replica(adapter, replica="r1", wait_hold=30)
    kv = await stack.bus.kv("platforms")
    key = subjects.platform_key("fake", "r1")

    async def status_until(check, timeout: float = 5.0) -> PlatformStatus:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = PlatformStatus.decode((await kv.get(key)).value)
                if check(status):
                    return status
            except (KeyNotFoundError, KeyDeletedError):
                status = None
            assert time.monotonic() < deadline, f"timed out; last status {status}"
            await asyncio.sleep(0.02)

    await stack.submit("first", duration=60)
    await until_waiting(stack, "first")
    await stack.submit("second", duration=60)
    await until_waiting(stack, "second")
    status = await status_until(lambda s: s.waiting == ["first:0", "second:0"])
    assert (status.adapter, status.replica, status.running) == ("fake", "r1", 0)

    adapter.free()  # one of them takes the slot, the other still waits
    status = await status_until(lambda s: s.running == 1)
    (started,) = adapter.platform.starts
    assert status.waiting == [f"{'second' if started == 'first' else 'first'}:0"]

    await stack.stop(service)
    with pytest.raises((KeyNotFoundError, KeyDeletedError)):
        await kv.get(key)
