"""The adapter service (the shared consume loop) with the fake adapter, over a real nats-server.

Trial requests go in on ``dispatch.fake`` as the dispatcher sends them; what comes out is
read back from the EVENTS stream, dedupe ids included, as the dispatcher would see it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import nats.errors
import nats.js.errors
import pytest
from prometheus_client import CollectorRegistry

from contracts import (
    CancelReply,
    CancelRequest,
    LocalConfig,
    LogReply,
    LogRequest,
    TrialEvent,
    TrialRequest,
    TrialStatus,
    subjects,
)
from contracts.base import utcnow
from services.adapters import AdapterService, AdapterSettings, PermanentError, TransientError
from services.adapters.base import TrialHandle
from services.adapters.fake import FakeAdapter, FakePlatform
from services.common.bus import Bus, bootstrap, connect


class SlowFake(FakeAdapter):
    """A fake whose launches take ``launch_seconds`` and can be told to fail."""

    def __init__(self, platform: FakePlatform, launch_seconds: float = 0.0) -> None:
        super().__init__(platform)
        self.launch_seconds = launch_seconds
        self.transient_left = 0
        self.no_room = 0  # launches answered "no capacity"

    async def launch(self, request: TrialRequest):
        await asyncio.sleep(self.launch_seconds)
        parameters = json.loads(request.parameter_record)["parameters"]
        if parameters.get("refuse"):
            raise PermanentError("the platform refuses this trial: no such image")
        if self.transient_left:
            self.transient_left -= 1
            raise TransientError("the platform is busy", delay=0.1)
        handle = await super().launch(request)
        self.no_room += handle is None
        return handle


class Stack:
    """The bus as the dispatcher sees it, plus the adapter services (replicas) under test."""

    def __init__(self, url: str, bus: Bus) -> None:
        self.url, self.bus = url, bus
        self.services: list[tuple[AdapterService, Bus]] = []
        self._seen: list[tuple[str, TrialEvent]] = []
        self._next_seq = 1

    async def replica(self, adapter: FakeAdapter, replica: str = "r1", **settings) -> AdapterService:
        config = AdapterSettings(
            nats_url=self.url, replica=replica, poll_interval=0.1, capacity_backoff=0.2, stop_timeout=3, **settings
        )
        bus = await connect(config, f"adapter-{replica}")
        service = AdapterService(adapter, config, registry=CollectorRegistry())
        await service.start(bus)
        self.services.append((service, bus))
        return service

    async def stop(self, service: AdapterService) -> None:
        bus = next(b for s, b in self.services if s is service)
        self.services.remove((service, bus))
        await service.stop()
        await bus.close()

    async def submit(
        self,
        trial: str,
        duration: float = 0.0,
        exit_code: int = 0,
        adapter: str = "fake",
        command: str = "true",
        **extra,
    ) -> TrialRequest:
        record = {"parameter_id": 0, "parameters": {"duration": duration, "exitCode": exit_code, **extra}}
        request = TrialRequest(
            experiment_id="exp1",
            trial_id=trial,
            sequence_id=0,
            trial_command=command,
            parameter_record=json.dumps(record),
            training_service=LocalConfig(),
            token="secret-token",
        )
        await self.bus.js.publish(
            subjects.dispatch(adapter), request.encode(), headers={"Nats-Msg-Id": subjects.dispatch_id(trial, 0)}
        )
        return request

    async def events(self) -> list[tuple[str, TrialEvent]]:
        """Every event stored so far, with its ``Nats-Msg-Id``, in stream order."""
        last = (await self.bus.js.stream_info("EVENTS")).state.last_seq
        while self._next_seq <= last:
            raw = await self.bus.js.get_msg("EVENTS", self._next_seq)
            self._seen.append((raw.headers["Nats-Msg-Id"], TrialEvent.decode(raw.data)))
            self._next_seq += 1
        return list(self._seen)

    async def until(self, check: Callable[[list[TrialEvent]], bool], timeout: float = 5.0) -> list[TrialEvent]:
        deadline = time.monotonic() + timeout
        while not check(events := [e for _, e in await self.events()]):
            assert time.monotonic() < deadline, f"timed out; events so far: {[(e.trial_id, e.status) for e in events]}"
            await asyncio.sleep(0.02)
        return events

    async def until_ended(self, *trials: str, timeout: float = 5.0) -> dict[str, TrialEvent]:
        def ended(events: list[TrialEvent]) -> bool:
            return {e.trial_id for e in events if e.status.terminal} >= set(trials)

        events = await self.until(ended, timeout)
        return {e.trial_id: e for e in events if e.status.terminal}

    async def dispatch_queue(self):
        return await self.bus.js.consumer_info("DISPATCH", "adapter-fake")

    async def close(self) -> None:
        for service, _ in list(self.services):
            await self.stop(service)


@pytest.fixture
async def stack(nats_server):
    bus = await connect(AdapterSettings(nats_url=nats_server.url, stop_timeout=2), "dispatcher")
    await bootstrap(bus.js)
    stack = Stack(nats_server.url, bus)
    yield stack
    await stack.close()
    await bus.close()


def statuses(events: list[TrialEvent], trial: str) -> list[TrialStatus]:
    return [e.status for e in events if e.trial_id == trial]


async def test_a_trial_is_announced_running_then_ended_with_dedupe_ids(stack: Stack) -> None:
    service = await stack.replica(FakeAdapter(), replica="r1", adapter_http_port=0)

    await stack.submit("ok", duration=0.1)
    await stack.submit("bad", exit_code=3)
    ended = await stack.until_ended("ok", "bad")

    stored = await stack.events()
    assert [(i, e.status) for i, e in stored if e.trial_id == "ok"] == [
        (subjects.running_event_id("ok", 0, "r1"), TrialStatus.RUNNING),
        ("ok:SUCCEEDED:0", TrialStatus.SUCCEEDED),
    ]
    assert ("bad:FAILED:0", TrialStatus.FAILED) in [(i, e.status) for i, e in stored]
    assert (ended["bad"].exit_code, ended["bad"].platform, ended["bad"].replica) == (3, "fake", "r1")
    assert "exited with code 3" in ended["bad"].message
    queue = await stack.dispatch_queue()
    assert (queue.num_pending, queue.num_ack_pending) == (0, 0)
    async with httpx.AsyncClient() as http:
        health = await http.get(f"http://127.0.0.1:{service.http_port}/healthz")
    assert health.status_code == 200 and health.json()["nats"] == "connected"
    assert (health.json()["trials"], health.json()["idle"]) == (0, True), "every trial ended: idle"
    labels = {"platform": "fake", "status": "FAILED"}
    assert service.registry.get_sample_value("trialbus_adapter_trials_ended_total", labels) == 1


async def test_cancel_over_the_control_subject_ends_the_trial_with_the_cancels_status(stack: Stack) -> None:
    await stack.replica(FakeAdapter(), replica="r1")
    await stack.submit("long", duration=60)
    await stack.until(lambda events: TrialStatus.RUNNING in statuses(events, "long"))

    raw = await stack.bus.nc.request(
        subjects.control("fake", "cancel"),
        CancelRequest(experiment_id="exp1", trial_id="long", status=TrialStatus.EARLY_STOPPED).encode(),
        timeout=2,
    )
    ended = await stack.until_ended("long")

    reply = CancelReply.decode(raw.data)
    assert (reply.accepted, reply.replica) == (True, "r1")
    assert ended["long"].status is TrialStatus.EARLY_STOPPED
    with pytest.raises(nats.errors.TimeoutError):  # nobody owns it: nobody answers
        await stack.bus.nc.request(
            subjects.control("fake", "cancel"),
            CancelRequest(experiment_id="exp1", trial_id="nobody").encode(),
            timeout=0.3,
        )


async def test_a_cancel_during_launch_takes_effect_once_launched(stack: Stack) -> None:
    service = await stack.replica(SlowFake(FakePlatform(), launch_seconds=0.5))
    await stack.submit("slow", duration=60)
    deadline = time.monotonic() + 3
    while not service.owned:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)

    raw = await stack.bus.nc.request(
        subjects.control("fake", "cancel"), CancelRequest(experiment_id="exp1", trial_id="slow").encode(), timeout=2
    )
    ended = await stack.until_ended("slow")

    assert CancelReply.decode(raw.data).accepted
    assert ended["slow"].status is TrialStatus.USER_CANCELED
    assert statuses(await stack.until(bool), "slow") == [TrialStatus.RUNNING, TrialStatus.USER_CANCELED]


async def test_no_capacity_naks_and_the_trial_runs_when_room_frees(stack: Stack) -> None:
    adapter = SlowFake(FakePlatform(capacity=1))
    await stack.replica(adapter)

    await stack.submit("first", duration=0.5)
    await stack.until(lambda events: TrialStatus.RUNNING in statuses(events, "first"))
    await stack.submit("second")
    ended = await stack.until_ended("first", "second")

    second_running = next(e for _, e in await stack.events() if e.trial_id == "second" and e.status == "RUNNING")
    assert second_running.time >= ended["first"].time
    assert adapter.no_room >= 1  # it was nak'ed and waited on the queue, not in memory
    assert ended["second"].status is TrialStatus.SUCCEEDED


async def test_two_replicas_share_the_queue_and_run_each_trial_once(stack: Stack) -> None:
    platforms = [FakePlatform(capacity=100), FakePlatform(capacity=100)]
    for name, platform in zip(("r1", "r2"), platforms, strict=True):
        await stack.replica(SlowFake(platform, launch_seconds=0.02), replica=name, launch_concurrency=2)

    trials = [f"t{i}" for i in range(30)]
    for trial in trials:
        await stack.submit(trial, duration=0.05)
    ended = await stack.until_ended(*trials, timeout=10)

    started = [sum(p.starts.get(t, 0) for p in platforms) for t in trials]
    assert started == [1] * len(trials)
    assert all(p.starts for p in platforms), "both replicas took work"
    running = [(i, e.replica) for i, e in await stack.events() if e.status is TrialStatus.RUNNING]
    assert sorted(i.split(":")[0] for i, _ in running) == sorted(trials)  # one RUNNING each, by the replica running it
    assert all(i == subjects.running_event_id(i.split(":")[0], 0, replica) for i, replica in running)
    assert {e.replica for e in ended.values()} == {"r1", "r2"}


async def test_errors_decide_the_retry(stack: Stack) -> None:
    adapter = SlowFake(FakePlatform())
    adapter.transient_left = 2
    await stack.replica(adapter)

    await stack.submit("flaky")
    await stack.submit("refused", refuse=True)
    await stack.bus.js.publish(subjects.dispatch("fake"), b'{"kind": "not a trial request"}')
    ended = await stack.until_ended("flaky", "refused")

    assert ended["flaky"].status is TrialStatus.SUCCEEDED
    assert (ended["refused"].status, ended["refused"].failure) == (TrialStatus.FAILED, "permanent")
    assert "no such image" in ended["refused"].message
    assert statuses(await stack.until(bool), "refused") == [TrialStatus.FAILED]
    queue = await stack.dispatch_queue()
    assert (queue.num_pending, queue.num_ack_pending) == (0, 0)  # the malformed one was terminated


async def test_the_owner_answers_log_requests(stack: Stack) -> None:
    await stack.replica(FakeAdapter(), replica="r1")
    await stack.submit("chatty")
    await stack.until_ended("chatty")

    raw = await stack.bus.nc.request(
        subjects.control("fake", "log"), LogRequest(experiment_id="exp1", trial_id="chatty").encode(), timeout=2
    )

    reply = LogReply.decode(raw.data)
    assert reply.replica == "r1" and "chatty" in reply.text


async def test_trials_outlive_a_restart_and_their_end_is_still_reported(stack: Stack) -> None:
    platform = FakePlatform()
    first = await stack.replica(FakeAdapter(platform))
    await stack.submit("survivor", duration=2.5)  # long enough to outlive a stop on a loaded host
    await stack.until(lambda events: TrialStatus.RUNNING in statuses(events, "survivor"))

    await stack.stop(first)
    assert platform.running() == 1  # stop left it running
    await stack.replica(FakeAdapter(platform))
    ended = await stack.until_ended("survivor")

    assert ended["survivor"].status is TrialStatus.SUCCEEDED
    assert statuses(await stack.until(bool), "survivor") == [TrialStatus.RUNNING, TrialStatus.SUCCEEDED]


async def test_a_terminal_event_survives_a_broker_restart(stack: Stack, nats_server) -> None:
    await stack.replica(FakeAdapter())
    await stack.submit("steady", duration=0.5)
    await stack.until(lambda events: TrialStatus.RUNNING in statuses(events, "steady"))

    await asyncio.to_thread(nats_server.stop)  # the trial ends while the broker is down
    await asyncio.sleep(1.0)
    await asyncio.to_thread(nats_server.start)
    ended = await stack.until_ended("steady", timeout=15)

    assert ended["steady"].status is TrialStatus.SUCCEEDED


async def test_the_local_gpu_service_process_stops_on_sigterm_and_adopts_on_restart(
    stack: Stack, nats_server, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_") or k == "TRIALBUS_TRIAL_USER"}
    env.update(
        TRIALBUS_NATS_URL=nats_server.url,
        TRIALBUS_DATA_DIR=str(tmp_path / "data"),
        TRIALBUS_REPLICA="host-a",
        TRIALBUS_GATEWAY_URL="http://127.0.0.1:9",
        TRIALBUS_KILL_GRACE="1",
        TRIALBUS_NNI_SHIM="never",
        TRIALBUS_STOP_TIMEOUT="5",
        TRIALBUS_CONTRACTS_STRICT="1",
    )

    def start() -> subprocess.Popen:
        log = open(tmp_path / "adapter.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "services.adapters.local_gpu"], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()

    async def stop(proc: subprocess.Popen) -> int:
        proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(proc.wait, 10)

    proc = start()
    try:
        await stack.submit("quick", adapter="local-gpu", command="echo hello")
        await stack.submit("long", adapter="local-gpu", command="sleep 60")
        await stack.until(lambda events: TrialStatus.RUNNING in statuses(events, "long"), timeout=15)
        ended = await stack.until_ended("quick", timeout=10)
        assert ended["quick"].status is TrialStatus.SUCCEEDED and ended["quick"].replica == "host-a"

        began = time.monotonic()
        assert await stop(proc) == 0
        assert time.monotonic() - began < 3  # prompt, and the trial was left running
        state = json.loads(next((tmp_path / "data").rglob("long-0/.trialbus/state.json")).read_text())
        os.kill(state["trialPid"], 0)

        proc = start()
        deadline = time.monotonic() + 15
        while True:  # as the dispatcher does: ask again until the owner is back and answers
            try:
                raw = await stack.bus.nc.request(
                    subjects.control("local-gpu", "cancel"),
                    CancelRequest(experiment_id="exp1", trial_id="long").encode(),
                    timeout=0.5,
                )
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                assert time.monotonic() < deadline, "the restarted adapter never answered"
                await asyncio.sleep(0.1)
        ended = await stack.until_ended("long", timeout=10)

        assert CancelReply.decode(raw.data).accepted
        assert ended["long"].status is TrialStatus.USER_CANCELED
        assert statuses(await stack.until(bool), "long") == [TrialStatus.RUNNING, TrialStatus.USER_CANCELED]
    finally:
        if proc.poll() is None:
            await stop(proc)
        for path in (tmp_path / "data").rglob(".trialbus/state.json"):  # trials outlive adapters: end them
            state = json.loads(path.read_text())
            for kill, target in ((os.killpg, state.get("pgid")), (os.kill, state.get("keeperPid"))):
                if target:
                    with contextlib.suppress(ProcessLookupError):
                        kill(target, signal.SIGKILL)
        print((tmp_path / "adapter.log").read_text())  # shown when the test fails


class QueuingFake(FakeAdapter):
    """A fake whose platform queue holds the trials named in ``held`` (as Kueue holds gated pods)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, str] = {}  # trial id → why the platform's queue holds it

    async def queued(self, handle: TrialHandle) -> str | None:
        return self.held.get(handle.trial_id)


async def test_a_trial_the_platform_queues_stays_waiting_then_runs(stack: Stack) -> None:
    adapter = QueuingFake()
    adapter.held["held"] = "queued in the fake's LocalQueue"
    await stack.replica(adapter)
    await stack.submit("held", duration=60)
    events = await stack.until(lambda events: TrialStatus.WAITING in statuses(events, "held"))
    [waiting] = [e for e in events if e.trial_id == "held"]
    assert waiting.message == "queued in the fake's LocalQueue"
    await asyncio.sleep(0.3)  # polled meanwhile: still held, nothing more said
    assert statuses(await stack.until(bool), "held") == [TrialStatus.WAITING]

    released = utcnow()
    del adapter.held["held"]
    events = await stack.until(lambda events: TrialStatus.RUNNING in statuses(events, "held"))
    [running] = [e for e in events if e.trial_id == "held" and e.status is TrialStatus.RUNNING]
    assert running.time >= released, "it started when the platform's queue let it go"
    await stack.bus.nc.request(
        subjects.control("fake", "cancel"), CancelRequest(experiment_id="exp1", trial_id="held").encode(), timeout=2
    )
    assert (await stack.until_ended("held"))["held"].status is TrialStatus.USER_CANCELED


async def test_a_cancel_reaches_a_trial_the_platform_still_queues(stack: Stack) -> None:
    adapter = QueuingFake()
    adapter.held["held"] = "queued in the fake's LocalQueue"
    await stack.replica(adapter)
    await stack.submit("held", duration=60)
    await stack.until(lambda events: TrialStatus.WAITING in statuses(events, "held"))

    raw = await stack.bus.nc.request(
        subjects.control("fake", "cancel"), CancelRequest(experiment_id="exp1", trial_id="held").encode(), timeout=2
    )
    ended = await stack.until_ended("held")

    assert CancelReply.decode(raw.data).accepted
    assert ended["held"].status is TrialStatus.USER_CANCELED
    assert statuses(await stack.until(bool), "held") == [TrialStatus.WAITING, TrialStatus.USER_CANCELED]
