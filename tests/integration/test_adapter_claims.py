"""Claims (services/adapters/claims.py) through the adapter service, over a real nats-server:
an attempt another live replica runs is never launched here, one it is still launching waits
for it, one claimed by a replica that is gone is taken over, and a request handed back
unlaunched leaves its claim to the others. The other replica is what it leaves on the bus:
its status in ``platforms``, its claim, the trial's state the dispatcher keeps."""

# ruff: noqa: F811 - each test takes the `stack` fixture imported below by its name
from __future__ import annotations

import asyncio
import time

import nats.js.errors

from contracts import PlatformStatus, TrialState, TrialStatus, streams
from contracts.base import utcnow
from services.adapters.fake import FakePlatform
from tests.integration.test_adapter_service import SlowFake, Stack, stack  # noqa: F401 - stack is a fixture


async def _claim(stack: Stack, trial: str, holder: str, attempt: int = 0) -> None:
    """``holder`` claimed the attempt, as its replica does right before launching it."""
    await (await stack.bus.kv(streams.CLAIMS_BUCKET.bucket)).put(f"fake.{trial}.{attempt}", holder.encode())


async def _alive(stack: Stack, replica: str) -> None:
    """The status a live replica named ``replica`` keeps fresh in ``platforms``."""
    status = PlatformStatus(adapter="fake", replica=replica, host="elsewhere", time=utcnow())
    await (await stack.bus.kv(streams.PLATFORMS_BUCKET.bucket)).put(f"fake.{replica}", status.encode())


async def _trial_is(stack: Stack, trial: str, status: TrialStatus, replica: str) -> None:
    """The trial's state as the dispatcher keeps it in ``trials``."""
    state = TrialState(
        id=trial,
        experiment_id="exp1",
        sequence_id=0,
        platform="fake",
        submit_time=utcnow(),
        status=status,
        replica=replica,
    )
    await (await stack.bus.kv(streams.TRIALS_BUCKET.bucket)).put(trial, state.encode())


async def _claim_of(stack: Stack, trial: str, attempt: int = 0) -> str | None:
    try:
        return (await (await stack.bus.kv(streams.CLAIMS_BUCKET.bucket)).get(f"fake.{trial}.{attempt}")).value.decode()
    except nats.js.errors.NotFoundError:
        return None


async def test_an_attempt_another_live_replica_runs_is_never_launched_here(stack: Stack) -> None:
    # Given an attempt that replica r2 claimed and runs (its request delivered again, as after a lost ack)
    platform = FakePlatform(capacity=10)
    await _alive(stack, "r2")
    await _claim(stack, "t1", "r2")
    await _trial_is(stack, "t1", TrialStatus.RUNNING, "r2")
    await stack.replica(SlowFake(platform), replica="r1")
    # When r1 gets the request
    await stack.submit("t1", duration=0.05)
    # Then it acks it without starting a second copy
    await _until_acked(stack)
    assert platform.starts.get("t1") is None and await _claim_of(stack, "t1") == "r2"
    assert not [e for _, e in await stack.events() if e.trial_id == "t1"]


async def test_an_attempt_another_replica_is_still_launching_waits_for_it(stack: Stack) -> None:
    # Given an attempt r2 claimed and has not launched yet (its trial still WAITING)
    platform = FakePlatform(capacity=10)
    await _alive(stack, "r2")
    await _claim(stack, "t2", "r2")
    await _trial_is(stack, "t2", TrialStatus.WAITING, "r2")
    await stack.replica(SlowFake(platform), replica="r1")
    await stack.submit("t2", duration=0.05)
    # Then r1 hands the request back, again and again, and never launches it while r2 holds the claim
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        assert platform.starts.get("t2") is None
        await asyncio.sleep(0.05)
    assert (await stack.dispatch_queue()).num_redelivered >= 1
    # When r2 gives the attempt up unlaunched (it drops its claim), r1 runs it, once
    await (await stack.bus.kv(streams.CLAIMS_BUCKET.bucket)).delete("fake.t2.0")
    ended = await stack.until_ended("t2")
    assert ended["t2"].replica == "r1" and platform.starts["t2"] == 1 and await _claim_of(stack, "t2") == "r1"


async def test_an_attempt_claimed_by_a_replica_that_is_gone_is_taken_over(stack: Stack, caplog) -> None:
    # Given an attempt claimed by a replica with no status any more (it died while launching)
    platform = FakePlatform(capacity=10)
    await _claim(stack, "t3", "gone")
    await stack.replica(SlowFake(platform), replica="r1")
    # When its request comes to r1, then r1 takes the claim over and runs it
    await stack.submit("t3", duration=0.05)
    ended = await stack.until_ended("t3")
    assert ended["t3"].replica == "r1" and platform.starts["t3"] == 1 and await _claim_of(stack, "t3") == "r1"
    assert "claimed by replica gone, which is gone: launching it here" in caplog.text


async def test_a_request_handed_back_unlaunched_leaves_its_claim_to_the_others(stack: Stack) -> None:
    # Given a replica whose platform is busy: the launch fails for now and the request goes back
    platform = FakePlatform(capacity=10)
    fake = SlowFake(platform)
    fake.transient_left = 1
    await stack.replica(fake, replica="r1")
    await stack.submit("t4", duration=0.05)
    # Then the claim is dropped with it, and the next delivery claims and runs it
    ended = await stack.until_ended("t4")
    assert ended["t4"].status is TrialStatus.SUCCEEDED and platform.starts["t4"] == 1
    assert await _claim_of(stack, "t4") == "r1"


async def _until_acked(stack: Stack, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (info := await stack.dispatch_queue()).num_ack_pending or info.num_pending:
        assert time.monotonic() < deadline, f"the request was never settled: {info}"
        await asyncio.sleep(0.05)
