"""The metrics gateway over real HTTP and a real nats-server (docs/internals.md §2)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import httpx
import nats
import pytest

import trialbus
from contracts import MetricRecord, subjects
from contracts.metrics import BatchedRecord, MetricBatch, Seen, records_of
from services.common.bus import Bus, bootstrap, connect
from services.common.tokens import trial_token
from services.metrics_gateway.app import MESSAGE_BYTES, Metric, encode_batches
from services.metrics_gateway.service import GatewayService
from services.metrics_gateway.settings import GatewaySettings

SECRET = "gateway-test-secret"
EXP, TRIAL = "k3x9a2bq", "Ab3dE"


def record(type_: str = "PERIODICAL", sequence: int = 0, value: object = "0.5", **fields) -> str:
    return json.dumps(
        {"parameter_id": 7, "trial_job_id": TRIAL, "type": type_, "sequence": sequence, "value": value, **fields}
    )


def headers(token: str | None = None, version: str | None = trialbus.__version__) -> dict:
    result = {"Authorization": f"Bearer {token or trial_token(SECRET, EXP, TRIAL)}"}
    if version is not None:
        result["X-Trialbus-Keeper-Version"] = version
    return result


class Gateway:
    """A gateway service in this process, its HTTP client and a reader of the METRICS stream."""

    def __init__(self, service: GatewayService, bus: Bus, reader: nats.NATS) -> None:
        self.service, self.bus, self.reader = service, bus, reader
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.port}", timeout=10)

    async def post(self, records: list, *, experiment: str = EXP, trial: str = TRIAL, **kwargs) -> httpx.Response:
        return await self.http.post(
            f"/api/v1/trials/{trial}/metrics",
            json={"experimentId": experiment, "records": records},
            headers=kwargs.pop("headers", None) or headers(),
            **kwargs,
        )

    async def stored(self, trial: str = TRIAL) -> list[tuple[dict, MetricRecord]]:
        """Every record of the trial in the METRICS stream: (its message's headers, record)."""
        js = self.reader.jetstream()
        info = await js.stream_info("METRICS", subjects_filter=subjects.metrics(EXP, trial))
        count = (info.state.subjects or {}).get(subjects.metrics(EXP, trial), 0)
        if not count:
            return []
        sub = await js.subscribe(subjects.metrics(EXP, trial), ordered_consumer=True)
        msgs = [await sub.next_msg(timeout=5) for _ in range(count)]
        await sub.unsubscribe()
        return [(msg.headers, record) for msg in msgs for record in records_of(msg.data)]


@pytest.fixture
async def gateway(nats_server, request):
    overrides = getattr(request, "param", {})
    settings = GatewaySettings(
        nats_url=nats_server.url,
        trial_secret=SECRET,
        gateway_port=0,
        gateway_publish_timeout=1.0,
        stop_timeout=5,
        **overrides,
    )
    bus = await connect(settings, "metrics-gateway-test")
    await bootstrap(bus.js)
    service = GatewayService(settings)
    await service.start(bus)
    reader = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    gateway = Gateway(service, bus, reader)
    yield gateway
    await gateway.http.aclose()
    await service.stop()
    await reader.close()
    await bus.nc.close()


async def test_records_are_published_once_even_when_the_batch_is_resent(gateway):
    batch = [
        record(sequence=0),
        record(sequence=1, value='{"default": 0.6, "loss": NaN}'),
        record("FINAL"),
        json.dumps({"trial_job_id": TRIAL, "type": "REQUEST_PARAMETER", "sequence": 0, "parameter_index": 0}),
    ]
    first = await gateway.post(batch)
    assert (first.status_code, first.json()) == (200, {"accepted": 4})
    # When the keeper did not see the answer and sends the same batch again
    again = await gateway.post(batch)
    assert again.status_code == 200
    # then every metric is in the stream exactly once, as one message, REQUEST_PARAMETER not at all
    stored = await gateway.stored()
    assert [(r.type.value, r.sequence) for _, r in stored] == [("PERIODICAL", 0), ("PERIODICAL", 1), ("FINAL", 0)]
    assert len({h["Nats-Msg-Id"] for h, _ in stored}) == 1
    metric = stored[1][1]
    assert (metric.experiment_id, metric.trial_id, metric.parameter_id) == (EXP, TRIAL, 7)
    assert metric.value == '{"default": 0.6, "loss": NaN}'
    assert stored[2][1].decoded() == 0.5


async def test_hello_without_records(gateway):
    answer = await gateway.post([])
    assert (answer.status_code, answer.json()) == (200, {"accepted": 0})


async def test_plain_json_values_are_encoded_as_the_sdk_would(gateway):
    answer = await gateway.post([record(value=0.25), record("FINAL", value={"default": 1})])
    assert answer.status_code == 200
    assert [r.value for _, r in await gateway.stored()] == ["0.25", '{"default": 1}']


async def test_a_wrong_or_missing_token_is_401(gateway):
    for token in (None, "0" * 64, trial_token(SECRET, EXP, "Other"), trial_token("another-secret", EXP, TRIAL)):
        auth = headers(token) if token else {"X-Trialbus-Keeper-Version": trialbus.__version__}
        answer = await gateway.post([record()], headers=auth)
        assert answer.status_code == 401, token
        assert "token" in answer.json()["error"]
    assert await gateway.stored() == []


async def test_a_token_is_only_good_for_its_own_trial(gateway):
    answer = await gateway.post([record()], trial="Other", headers=headers())
    assert answer.status_code == 401


async def test_another_major_minor_is_409_naming_both_versions(gateway):
    for version in ("9.9.0", "0.10.0", "1.1", "garbage"):  # 0.10 is not 0.1 (NNI's regex would say it is)
        answer = await gateway.post([record()], headers=headers(version=version))
        assert answer.status_code == 409, version
        message = answer.json()["error"]
        assert version in message and trialbus.__version__ in message
    assert await gateway.stored() == []


async def test_another_patch_release_is_accepted(gateway):
    major, minor, *_ = trialbus.__version__.split(".")
    answer = await gateway.post([record()], headers=headers(version=f"{major}.{minor}.99"))
    assert answer.status_code == 200


async def test_a_keeper_must_announce_its_version(gateway):
    answer = await gateway.post([record()], headers=headers(version=None))
    assert answer.status_code == 400
    assert "announce its version" in answer.json()["error"]


BAD_RECORDS = (
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    (record(trial_job_id="Other"), "trial_job_id"),
    (record("EPOCH"), "type"),
    (record(sequence=-1), "sequence"),
    (record(sequence=True), "sequence"),
    (record(sequence="3"), "sequence"),
    (record(value="{oops"), "value"),
    (record(parameter_id=1.5), "parameter_id"),
    (json.dumps({"trial_job_id": TRIAL, "type": "FINAL", "sequence": 0}), "no value"),
    (42, "JSON object"),
)


async def test_a_bad_record_is_400_naming_it_and_nothing_is_published(gateway):
    for bad, problem in BAD_RECORDS:
        answer = await gateway.post([record(sequence=0), record(sequence=1), bad])
        assert answer.status_code == 400, bad
        message = answer.json()["error"]
        assert message.startswith("record 2:") and problem in message, (bad, message)
    assert await gateway.stored() == []


async def test_a_malformed_body_is_400(gateway):
    for body in (b"{", b"[]", b'{"experimentId": "a.b", "records": []}', b'{"experimentId": "x"}'):
        answer = await gateway.http.post(f"/api/v1/trials/{TRIAL}/metrics", content=body, headers=headers())
        assert answer.status_code == 400, body


@pytest.mark.parametrize("gateway", [{"gateway_max_body": 2000, "gateway_max_records": 3}], indirect=True)
async def test_oversized_requests_are_413(gateway):
    too_many = await gateway.post([record(sequence=i) for i in range(4)])
    assert too_many.status_code == 413 and "4 records" in too_many.json()["error"]
    too_big = await gateway.post([record(value=json.dumps("x" * 3000))])
    assert too_big.status_code == 413 and "2000 bytes" in too_big.json()["error"]

    async def chunked():  # no Content-Length: the cap applies to what is read
        for _ in range(5):
            yield b" " * 1000

    streamed = await gateway.http.post(f"/api/v1/trials/{TRIAL}/metrics", content=chunked(), headers=headers())
    assert streamed.status_code == 413
    assert await gateway.stored() == []
    assert (await gateway.post([record(sequence=i) for i in range(3)])).status_code == 200


async def test_the_served_route_answers_as_the_fastapi_route_would(gateway):
    # The gateway serves POSTs to the metrics route straight from its intake (MetricsRoute); its
    # FastAPI route, which the OpenAPI document describes, must give the very same answers.
    route = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.service.app), base_url="http://gateway")
    path = f"/api/v1/trials/{TRIAL}/metrics"
    cases = [
        {"json": {"experimentId": EXP, "records": [record(sequence=0), record("FINAL")]}, "headers": headers()},
        {"json": {"experimentId": EXP, "records": []}, "headers": headers(version=None)},
        {"json": {"experimentId": EXP, "records": []}, "headers": headers(version="9.9.0")},
        {"json": {"experimentId": EXP, "records": [record()]}, "headers": headers("0" * 64)},
        {"json": {"experimentId": EXP, "records": [record(), record(sequence=-1)]}, "headers": headers()},
        {"content": b"{", "headers": headers()},
        {"json": {"experimentId": EXP, "records": []}, "headers": {}},
    ]
    try:
        for case in cases:
            served, routed = await gateway.http.post(path, **case), await route.post(path, **case)
            assert (served.status_code, served.json()) == (routed.status_code, routed.json()), case
            assert served.headers["content-type"] == routed.headers["content-type"] == "application/json"
        for method, other in (("GET", path), ("POST", path + "/"), ("POST", "/api/v1/trials/a/b/metrics")):
            served, routed = await gateway.http.request(method, other), await route.request(method, other)
            assert served.status_code == routed.status_code and served.status_code in (404, 405, 307), (method, other)
    finally:
        await route.aclose()


async def test_503_while_nats_is_down_then_accepted_once_it_is_back(gateway, nats_server):
    # Given NATS goes away
    nats_server.stop()
    for _ in range(100):
        if not gateway.bus.nc.is_connected:
            break
        await asyncio.sleep(0.02)
    # then a batch is refused with 503, so that the keeper retries
    answer = await gateway.post([record()])
    assert answer.status_code == 503
    assert "retry" in answer.json()["error"]
    health = await gateway.http.get("/healthz")
    assert health.status_code == 503
    # and when NATS is back, the retry is accepted and published once
    nats_server.start()
    for _ in range(250):
        if gateway.bus.nc.is_connected and gateway.reader.is_connected:
            break
        await asyncio.sleep(0.02)
    assert (await gateway.post([record()])).status_code == 200
    assert len(await gateway.stored()) == 1


async def test_health_and_prometheus_metrics(gateway):
    await gateway.post([record()])
    await gateway.post([record()], headers=headers(version="9.9.0"))
    assert (await gateway.http.get("/healthz")).json()["nats"] == "connected"
    text = (await gateway.http.get("/metrics")).text
    assert 'trialbus_gateway_records_total{outcome="published"}' in text
    assert 'trialbus_gateway_rejections_total{reason="version"}' in text
    assert "trialbus_gateway_publish_seconds_bucket" in text


def test_the_service_refuses_to_start_without_the_trial_secret():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    done = subprocess.run(
        [sys.executable, "-m", "services.metrics_gateway"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert "TRIALBUS_TRIAL_SECRET" in done.stderr and "dispatcher" in done.stderr


@pytest.mark.parametrize("microsecond", [0, 1000, 123456])
@pytest.mark.parametrize(
    "metric",
    [
        Metric("PERIODICAL", 3, 7, "0.5"),
        Metric("FINAL", 0, None, '{"default": NaN}'),
        Metric("FINAL", 0, "3_0_11", '"é"'),
    ],
)
def test_the_fast_encoding_is_the_contract_encoding(metric, microsecond):
    now = datetime(2026, 1, 2, 3, 4, 5, microsecond, tzinfo=UTC)
    second = Metric("PERIODICAL", 4, None, "[1, 2]")
    model = MetricBatch(
        experiment_id=EXP,
        trial_id=TRIAL,
        attempt=2,
        timestamp=now,
        records=[
            BatchedRecord(parameter_id=m.parameter_id, type=m.type, sequence=m.sequence, value=m.value)
            for m in (metric, second)
        ],
    )
    [(payload, _)] = encode_batches(EXP, TRIAL, [metric, second], now, attempt=2)
    assert payload == model.encode()
    alone = MetricRecord(
        experiment_id=EXP,
        trial_id=TRIAL,
        attempt=2,
        parameter_id=metric.parameter_id,
        type=metric.type,
        sequence=metric.sequence,
        value=metric.value,
        timestamp=now,
    )
    assert records_of(payload)[0] == alone  # a reader sees the record as if it had been published alone


async def test_a_big_batch_goes_out_in_parts_each_resent_the_same_way(gateway):
    value = json.dumps("x" * 2000)
    batch = [record(sequence=i, value=value) for i in range(300)]  # ~600 kB of values
    assert (await gateway.post(batch)).status_code == 200
    assert (await gateway.post(batch)).status_code == 200  # resent as it was: every part is a repeat
    stored = await gateway.stored()
    assert [r.sequence for _, r in stored] == list(range(300))
    parts = [h["Nats-Msg-Id"] for h, _ in stored]
    assert 2 <= len(set(parts)) <= 600_000 // MESSAGE_BYTES + 2


async def test_records_resent_in_another_grouping_are_taken_once_by_readers(gateway):
    """A keeper whose batch was published but whose answer was lost sends its records again
    with newer ones: the stream holds the overlap twice, a reader takes each record once."""
    assert (await gateway.post([record(sequence=i) for i in range(3)])).status_code == 200
    assert (await gateway.post([record(sequence=i) for i in range(5)] + [record("FINAL")])).status_code == 200
    seen = Seen()
    taken = [(r.type.value, r.sequence) for _, r in await gateway.stored() if seen.first_time(r)]
    assert taken == [("PERIODICAL", i) for i in range(5)] + [("FINAL", 0)]
