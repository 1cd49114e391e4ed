"""The client against a real nats-server: code snapshots in the object store, and the
event and metric streams read by ``events()``, ``metrics()`` and ``wait_final()``.

No dispatcher runs here: records are published onto the streams as the adapters and the
gateway publish them.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext

from contracts import MetricRecord, MetricType, TrialEvent, TrialStatus, subjects
from contracts.metrics import BatchedRecord, MetricBatch
from contracts.streams import CODE_STORE, STREAMS
from services.common.code import upload_code
from tests.fixtures.nats import NatsServer
from trialbus.client import AsyncClient, Client, TrialbusError

EXP = "exp1"


@pytest.fixture
async def js(nats_server: NatsServer):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    for config in STREAMS:
        await js.add_stream(config)
    yield js
    await nc.drain()


@pytest.fixture
async def client(nats_server: NatsServer, js: JetStreamContext):
    async with AsyncClient(nats_server.url, request_timeout=1) as client:
        yield client


def code_dir(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "trial.py").write_text("import nni\n")
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / "debug.log").write_text("noise\n")
    (root / ".nniignore").write_text("*.log\n")
    return root


async def publish_metric(js: JetStreamContext, trial: str, kind: MetricType, seq: int, value: object) -> None:
    record = MetricRecord(
        experiment_id=EXP, trial_id=trial, type=kind, sequence=seq, value=json.dumps(value), timestamp=datetime.now(UTC)
    )
    await js.publish(subjects.metrics(EXP, trial), record.encode())


async def publish_event(
    js: JetStreamContext,
    trial: str,
    status: TrialStatus,
    attempt: int = 0,
    source: str = "local-gpu",
    subject: str | None = None,
) -> None:
    """As ``source`` (an adapter, or the dispatcher) publishes it; ``subject`` replaces its subject."""
    event = TrialEvent(experiment_id=EXP, trial_id=trial, status=status, attempt=attempt, time=datetime.now(UTC))
    await js.publish(subject or subjects.events(EXP, trial, source), event.encode())


# -- code snapshots --------------------------------------------------------------------------


async def test_a_second_upload_of_the_same_code_sends_nothing(js: JetStreamContext, tmp_path: Path) -> None:
    root = code_dir(tmp_path / "code")

    first = await upload_code(js, root)
    stored = (await js.stream_info(f"OBJ_{CODE_STORE.bucket}")).state.messages
    second = await upload_code(js, root)

    assert first.uploaded and not second.uploaded
    assert first.ref == second.ref and first.size == second.size
    assert (await js.stream_info(f"OBJ_{CODE_STORE.bucket}")).state.messages == stored


async def test_the_stored_object_is_named_by_its_hash_and_extracts_to_the_files(
    client: AsyncClient, js: JetStreamContext, tmp_path: Path
) -> None:
    root = code_dir(tmp_path / "code")

    upload = await client.upload_code(root)

    store = await js.object_store(CODE_STORE.bucket)
    obj = await store.get(upload.ref.removeprefix("sha256:"))
    with tarfile.open(fileobj=io.BytesIO(obj.data), mode="r:gz") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    out = tmp_path / "out"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        ".nniignore",
        "pkg/model.py",
        "trial.py",
    ]
    assert (out / "trial.py").read_text() == "import nni\n"


async def test_create_experiment_uploads_the_code_then_needs_a_dispatcher(
    client: AsyncClient, js: JetStreamContext, tmp_path: Path
) -> None:
    root = code_dir(tmp_path / "code")
    config = {
        "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(root),
        "trialConcurrency": 1,
        "trainingService": {"platform": "local"},
    }

    with pytest.raises(TrialbusError, match="no dispatcher answers") as raised:
        await client.create_experiment(config)

    assert raised.value.status == 503
    store = await js.object_store(CODE_STORE.bucket)
    assert len(await store.list()) == 1


# -- streams -------------------------------------------------------------------------------


async def test_events_and_metrics_are_yielded_once_each(client: AsyncClient, js: JetStreamContext) -> None:
    for _ in range(2):  # published twice, no dedupe id: the stream keeps both copies
        await publish_event(js, "t1", TrialStatus.RUNNING)
        await publish_metric(js, "t1", MetricType.PERIODICAL, 0, 0.1)
    await publish_event(js, "t1", TrialStatus.SUCCEEDED)
    await publish_metric(js, "t1", MetricType.FINAL, 0, 0.9)

    async def first(n: int, records) -> list:
        got = []
        async for record in records:
            got.append(record)
            if len(got) == n:
                break
        await records.aclose()
        return got

    events = await first(2, client.events(EXP))
    metrics = await first(2, client.metrics(EXP, "t1"))
    assert [e.status for e in events] == [TrialStatus.RUNNING, TrialStatus.SUCCEEDED]
    assert [(m.type, m.decoded()) for m in metrics] == [(MetricType.PERIODICAL, 0.1), (MetricType.FINAL, 0.9)]


async def test_a_keepers_batches_are_yielded_record_by_record_each_once(
    client: AsyncClient, js: JetStreamContext
) -> None:
    """What the gateway publishes: a batch per keeper request; a batch resent with newer records
    (its first answer lost) holds the older ones again."""

    async def publish_batch(*records: tuple[MetricType, int]) -> None:
        batch = MetricBatch(
            experiment_id=EXP,
            trial_id="t2",
            timestamp=datetime.now(UTC),
            records=[BatchedRecord(type=kind, sequence=seq, value=json.dumps(seq / 10)) for kind, seq in records],
        )
        await js.publish(subjects.metrics(EXP, "t2"), batch.encode())

    await publish_batch(*((MetricType.PERIODICAL, i) for i in range(3)))
    await publish_batch(*((MetricType.PERIODICAL, i) for i in range(5)), (MetricType.FINAL, 0))
    got = []
    records = client.metrics(EXP, "t2")
    async for record in records:
        got.append((record.type, record.sequence, record.decoded()))
        if len(got) == 6:
            break
    await records.aclose()
    assert got == [(MetricType.PERIODICAL, i, i / 10) for i in range(5)] + [(MetricType.FINAL, 0, 0.0)]


async def test_a_trials_events_are_read_from_every_source_and_from_before_sources(
    client: AsyncClient, js: JetStreamContext
) -> None:
    # Given a trial whose WAITING an older version wrote without a source (before an upgrade),
    # whose RUNNING its adapter published, and whose end the dispatcher decided; and another trial
    await publish_event(js, "t2", TrialStatus.WAITING, subject=f"events.{EXP}.t2")
    await publish_event(js, "t2", TrialStatus.RUNNING, source="remote")
    await publish_event(js, "other", TrialStatus.RUNNING, source="remote")
    await publish_event(js, "t2", TrialStatus.USER_CANCELED, source=subjects.DISPATCHER)

    async def first(n: int, events) -> list[tuple[str, TrialStatus]]:
        got = []
        async with contextlib.aclosing(events):
            async for event in events:
                got.append((event.trial_id, event.status))
                if len(got) == n:
                    return got

    # When a tuner reads that trial's events, and the experiment's
    one = await asyncio.wait_for(first(3, client.events(EXP, "t2")), 10)
    every = await asyncio.wait_for(first(4, client.events(EXP)), 10)

    # Then it sees every one, in order, the older one included; and waiting for the trial ends
    statuses = [TrialStatus.WAITING, TrialStatus.RUNNING, TrialStatus.USER_CANCELED]
    assert one == [("t2", status) for status in statuses]
    assert every == [*one[:2], ("other", TrialStatus.RUNNING), one[2]]
    assert (await client.wait_trial("t2", 10, experiment_id=EXP)).status == TrialStatus.USER_CANCELED


async def test_a_slow_reader_gets_every_metric_in_order_with_a_bounded_buffer(
    client: AsyncClient, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a history far longer than the iterator may buffer ahead of its reader
    monkeypatch.setattr("trialbus.async_client.FOLLOW_BUFFER", 16)
    for seq in range(300):
        await publish_metric(js, "long", MetricType.PERIODICAL, seq, seq)
    records = client.metrics(EXP, "long")
    got = []

    # When the tuner reads slowly, and more records arrive while it reads
    async for record in records:
        got.append(record.sequence)
        if len(got) % 50 == 0:
            await asyncio.sleep(0.05)  # the server is held back meanwhile (flow control)
        if len(got) == 300:
            await publish_metric(js, "long", MetricType.FINAL, 0, 1.0)
        if len(got) == 301:
            break
    await records.aclose()

    # Then it has seen each record once, in stream order, history then live
    assert got == [*range(300), 0]


async def test_closing_the_client_ends_its_iterators(nats_server: NatsServer, js: JetStreamContext) -> None:
    await publish_metric(js, "t9", MetricType.PERIODICAL, 0, 0.1)
    client = await AsyncClient(nats_server.url).connect()
    seen = []

    async def follow() -> None:
        async for record in client.metrics(EXP):
            seen.append(record.sequence)

    reader = asyncio.create_task(follow())
    while not seen:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(client.close(), 10)

    await asyncio.wait_for(reader, 5)  # ended, not left waiting for records that cannot come
    assert seen == [0]


async def test_wait_final_resolves_for_trials_that_ended_before_and_after_the_wait(
    client: AsyncClient, js: JetStreamContext
) -> None:
    # Given one trial that already ended with a final metric and one that ended without
    await publish_metric(js, "done", MetricType.FINAL, 0, {"default": 0.7, "loss": 0.3})
    await publish_event(js, "done", TrialStatus.SUCCEEDED)
    await publish_event(js, "failed", TrialStatus.FAILED)

    # When a tuner waits for them and for a trial that reports later
    later = asyncio.create_task(client.wait_final("later", 10, experiment_id=EXP))
    assert await client.wait_final("done", 10, experiment_id=EXP) == {"default": 0.7, "loss": 0.3}
    assert await client.wait_final("failed", 10, experiment_id=EXP) is None
    await publish_event(js, "later", TrialStatus.RUNNING)
    await publish_metric(js, "later", MetricType.FINAL, 0, 0.5)

    # Then each gets its value; the one still waiting gets it the moment it arrives
    assert await later == 0.5


async def test_the_end_of_a_trial_waits_for_its_metrics_to_be_read(client: AsyncClient, js: JetStreamContext) -> None:
    # Given a long metric history, so the end event is read long before the trial's FINAL
    for seq in range(1500):
        await publish_metric(js, "busy", MetricType.PERIODICAL, seq, seq)
    await publish_metric(js, "slow", MetricType.FINAL, 0, 0.25)
    await publish_event(js, "slow", TrialStatus.SUCCEEDED)

    outcome = await client.wait_trial("slow", 10, experiment_id=EXP)

    assert (outcome.status, outcome.final) == (TrialStatus.SUCCEEDED, 0.25)


async def test_hundreds_of_waits_share_one_watcher(client: AsyncClient, js: JetStreamContext) -> None:
    trials = [f"t{i}" for i in range(300)]
    waits = [asyncio.create_task(client.wait_final(t, 20, experiment_id=EXP)) for t in trials]
    for i, trial in enumerate(trials):
        await publish_metric(js, trial, MetricType.FINAL, 0, i)
    assert await asyncio.gather(*waits) == list(range(300))
    # one consumer per stream for the whole experiment, none per trial
    assert (await js.stream_info("EVENTS")).state.consumer_count == 1
    assert (await js.stream_info("METRICS")).state.consumer_count == 1


async def test_wait_final_times_out_with_a_clear_error(client: AsyncClient, js: JetStreamContext) -> None:
    with pytest.raises(TimeoutError, match="trial quiet did not report a final metric within 0.2s"):
        await client.wait_final("quiet", 0.2, experiment_id=EXP)


async def test_close_fails_pending_waits_and_leaves_no_tasks(nats_server: NatsServer, js: JetStreamContext) -> None:
    client = await AsyncClient(nats_server.url).connect()
    pending = asyncio.create_task(client.wait_final("never", experiment_id=EXP))
    await asyncio.sleep(0.2)
    await client.close()
    with pytest.raises(ConnectionError):
        await pending
    leftover = [t for t in asyncio.all_tasks() if "trialbus" in t.get_coro().cr_code.co_filename]
    assert leftover == []
    assert client._nc is not None and client._nc.is_closed


def test_the_sync_client_runs_the_same_api(nats_server: NatsServer, tmp_path: Path) -> None:
    root = code_dir(tmp_path / "code")
    with Client(nats_server.url) as client:
        first, second = client.upload_code(root), client.upload_code(root)
        assert first.ref == second.ref and not second.uploaded
        with pytest.raises(TrialbusError, match="no dispatcher answers"):
            client.list_experiments()
