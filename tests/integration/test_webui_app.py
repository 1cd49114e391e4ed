"""The web UI service against a real nats-server: what it serves from the buckets and the
METRICS stream, live updates, auth, 404s, secrets, and actions relayed to the dispatcher."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import httpx
import orjson
import pytest

from contracts import MetricRecord, MetricType, TrialStatus, sealing, streams, subjects
from contracts.base import utcnow
from services.common.bus import Bus, bootstrap, connect
from services.common.settings import ServiceSettings
from services.webui.service import WebuiService
from services.webui.settings import WebuiSettings
from tests.unit.test_webui_model import PAI_TOKEN, START, experiment, local_config, openpai_config, trial

TOKEN = "webui-test-token-5d1e"
READ_TOKEN = "webui-read-only-token-77a0"


@pytest.fixture
async def bus(nats_server) -> AsyncIterator[Bus]:
    bus = await connect(ServiceSettings(nats_url=nats_server.url), "webui-test")
    await bootstrap(bus)
    yield bus
    await bus.close()


def as_the_dispatcher_writes(state: Any) -> bytes:
    """``state`` as the bucket holds it: platform secrets sealed, with a key this web UI lacks."""
    sealing.install(sealing.generate_key())
    try:
        return state.encode()
    finally:
        sealing.install(None)


class Webui:
    """A web UI service in this process, an HTTP client for it, and writers of its inputs."""

    def __init__(self, service: WebuiService, bus: Bus) -> None:
        self.service, self.bus = service, bus
        self.url = f"http://127.0.0.1:{service.port}"
        self.http = httpx.AsyncClient(base_url=self.url, timeout=10)

    async def put(self, *states: Any) -> None:
        for state in states:
            bucket = streams.TRIALS_BUCKET if state.kind == "trial.state" else streams.EXPERIMENTS_BUCKET
            await (await self.bus.kv(bucket.bucket)).put(state.id, as_the_dispatcher_writes(state))

    async def metric(
        self, trial_id: str, sequence: int, value: Any, kind: str = "PERIODICAL", attempt: int = 0
    ) -> None:
        """A record as the gateway publishes it (with its ``Nats-Msg-Id``)."""
        record = MetricRecord(experiment_id="exp1", trial_id=trial_id, type=MetricType(kind), sequence=sequence,
                              attempt=attempt, value=json.dumps(value), timestamp=utcnow())  # fmt: skip
        msg_id = subjects.metric_id(trial_id, kind, sequence, attempt)
        await self.bus.js.publish(subjects.metrics("exp1", trial_id), record.encode(), headers={"Nats-Msg-Id": msg_id})

    @contextlib.asynccontextmanager
    async def events(self, path: str, **kwargs: Any) -> AsyncIterator[Events]:
        async with self.http.stream("GET", path, **kwargs) as response:
            assert response.status_code == 200, (await response.aread()).decode()
            assert response.headers["content-type"].startswith("text/event-stream")
            yield Events(response)


class Events:
    """Server-sent events read one at a time: ``(event, data)``."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()
        self.raw: list[str] = []

    async def next(self, timeout: float = 5.0) -> tuple[str, Any]:
        event, data = "", []
        async with asyncio.timeout(timeout):
            while True:
                line = await anext(self.lines)
                self.raw.append(line)
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    data.append(line.removeprefix("data: "))
                elif line == "" and data:
                    return event, json.loads("".join(data))

    async def until(self, check: Callable[[str, Any], bool], timeout: float = 5.0) -> list[tuple[str, Any]]:
        """Every event up to and including the first that passes ``check``."""
        seen = []
        async with asyncio.timeout(timeout):
            while True:
                seen.append(await self.next(timeout))
                if check(*seen[-1]):
                    return seen


@contextlib.asynccontextmanager
async def running(bus: Bus, nats_url: str, **settings: Any) -> AsyncIterator[Webui]:
    config = WebuiSettings(nats_url=nats_url, webui_port=0, webui_batch_interval=0.05, webui_request_timeout=2,
                           webui_platform_interval=0.5,
                           **{"api_auth": "token" if settings.get("api_token") else "none", **settings})  # fmt: skip
    service = WebuiService(config)
    await service.start(bus)
    webui = Webui(service, bus)
    try:
        yield webui
    finally:
        await webui.http.aclose()
        await service.stop()


@pytest.fixture
async def webui(bus: Bus, nats_server) -> AsyncIterator[Webui]:
    async with running(bus, nats_server.url) as webui:
        yield webui


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    async with asyncio.timeout(timeout):
        while not (value := await check()):
            await asyncio.sleep(0.02)
    return value


async def test_the_overview_and_rows_come_from_the_buckets(bus: Bus, nats_server) -> None:
    minimize = experiment(config=local_config(tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}))
    await (await bus.kv("experiments")).put("exp1", minimize.encode())
    await (await bus.kv("trials")).put("T1", trial("T1", 0, status=TrialStatus.SUCCEEDED, final_metric=0.7).encode())
    async with running(bus, nats_server.url) as webui:  # what was there before it started
        await webui.put(trial("T2", 1, status=TrialStatus.SUCCEEDED, final_metric={"default": 0.2, "acc": 0.9}),
                        trial("T3", 2, status=TrialStatus.RUNNING))  # and what came after  # fmt: skip

        async def three() -> dict | None:
            body = (await webui.http.get("/api/experiments/exp1")).json()
            return body if body["trialCount"] == 3 else None

        overview = await eventually(three)
        assert overview["best"] == {"value": 0.2, "trialId": "T2", "sequenceId": 1}
        assert overview["trialCounts"]["SUCCEEDED"] == 2 and overview["trialCounts"]["RUNNING"] == 1
        assert overview["name"] == "demo" and overview["config"]["trialConcurrency"] == 2
        window = (await webui.http.get("/api/experiments/exp1/trials")).json()
        rows = window["trials"]
        assert [r["id"] for r in rows] == ["T1", "T2", "T3"] and rows[1]["default"] == 0.2 and window["total"] == 3
        best = (await webui.http.get("/api/experiments/exp1/trials", params={"sort": "metric", "limit": 1})).json()
        assert [r["id"] for r in best["trials"]] == ["T2"], "minimize: the lowest final first"
        assert (await webui.http.get("/api/experiments")).json()[0]["id"] == "exp1"
        assert (await webui.http.get("/api/trials/T3")).json()["status"] == "RUNNING"


async def test_the_table_reads_any_window_sorted_and_filtered_on_the_server(webui: Webui) -> None:
    # Given 300 trials: every third succeeded with a metric, the others are running
    await webui.put(experiment(), *(
        trial(f"T{i:03d}", i, status=TrialStatus.SUCCEEDED, final_metric=(i * 7) % 100) if i % 3 == 0
        else trial(f"T{i:03d}", i, status=TrialStatus.RUNNING) for i in range(300)))  # fmt: skip
    await eventually(lambda: _json_if(webui, "/api/experiments/exp1", lambda b: b["trialCount"] == 300), timeout=30)

    async def window(**params: Any) -> dict:
        answer = await webui.http.get("/api/experiments/exp1/trials", params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()

    # When a table asks for its last rows, newest first, best first, or one status
    last = await window(offset=290, limit=50)
    newest = await window(order="desc", limit=2)
    best = await window(sort="metric", limit=3)
    worst = await window(sort="metric", order="desc", limit=1)
    running = await window(status="RUNNING", offset=195, limit=10)
    # Then each is that slice, with the number of rows under its filter
    assert [r["id"] for r in last["trials"]] == [f"T{i}" for i in range(290, 300)] and last["total"] == 300
    assert [r["id"] for r in newest["trials"]] == ["T299", "T298"]
    assert [r["default"] for r in best["trials"]] == [99, 98, 97] and worst["trials"][0]["default"] == 0
    assert [r["id"] for r in running["trials"]] == ["T293", "T295", "T296", "T298", "T299"] and running["total"] == 200
    # and a paging user sees every trial once
    pages = [await window(sort="metric", offset=offset, limit=64) for offset in range(0, 300, 64)]
    seen = [r["id"] for page in pages for r in page["trials"]]
    assert sorted(seen) == sorted(f"T{i:03d}" for i in range(300))
    for bad in ({"sort": "name"}, {"order": "up"}, {"status": "DONE"}, {"limit": "0"}, {"offset": "-1"}):
        refused = await webui.http.get("/api/experiments/exp1/trials", params=bad)
        assert refused.status_code == 400 and next(iter(bad)) in refused.json()["error"], bad

    # and the overview chart holds at most the points asked for, the best and worst among them
    chart = (await webui.http.get("/api/experiments/exp1/chart", params={"points": 20})).json()
    values = [v for _, v in chart["points"]]
    assert len(values) <= 20 and max(values) == 99 and min(values) == 0 and chart["count"] == 100
    assert chart["best"][-1][1] == 99, "maximize: the best so far ends at the highest"


async def _json_if(webui: Webui, path: str, check: Callable[[Any], bool]) -> Any:
    answer = await webui.http.get(path)
    return answer.json() if answer.status_code == 200 and check(answer.json()) else None


async def test_secrets_never_leave_the_web_ui(webui: Webui) -> None:
    await webui.put(experiment(config=openpai_config()), trial("T1", 0))
    await eventually(lambda: _ok(webui, "/api/trials/T1"))
    answers = [await webui.http.get(path) for path in
               ("/", "/experiments/exp1", "/api/experiments", "/api/experiments/exp1", "/api/experiments/exp1/trials",
                "/api/trials/T1", "/static/app.js")]  # fmt: skip
    async with webui.events("/api/events?experiment=exp1") as events:
        _, snapshot = await events.next()
    shown = "".join(a.text for a in answers) + json.dumps(snapshot)
    assert all(a.status_code == 200 for a in answers)
    assert PAI_TOKEN not in shown and "sealed:v1:" not in shown
    assert snapshot["experiment"]["config"]["trainingService"]["token"] == "**********"


async def _ok(webui: Webui, path: str) -> bool:
    return (await webui.http.get(path)).status_code == 200


async def test_unknown_ids_get_404s_that_name_them(webui: Webui) -> None:
    page = await webui.http.get("/experiments/nosuch42")
    assert page.status_code == 404 and "text/html" in page.headers["content-type"] and "nosuch42" in page.text
    for path in ("/api/experiments/nosuch42", "/api/experiments/nosuch42/trials", "/api/events?experiment=nosuch42",
                 "/api/trials/nosuch42", "/api/trials/nosuch42/metrics", "/api/trials/nosuch42/metrics/stream"):
        answer = await webui.http.get(path)
        assert answer.status_code == 404 and "nosuch42" in answer.json()["error"], path
    unknown = await webui.http.get("/api/nothing")
    assert unknown.status_code == 404 and "error" in unknown.json()
    assert (await webui.http.delete("/api/experiments")).status_code == 405


async def test_the_page_at_root_follows_the_newest_experiment_live(webui: Webui) -> None:
    assert (await webui.http.get("/")).status_code == 200
    async with webui.events("/api/events") as events:
        event, snapshot = await events.next()
        assert (event, snapshot["experiment"], snapshot["trials"]) == ("snapshot", None, [])
        await webui.put(experiment("old", start=START), experiment("new", start=START + timedelta(hours=1)))
        seen = await events.until(lambda e, d: e == "snapshot" and d["experiment"]["id"] == "new")
        assert any(e == "experiments" for e, _ in seen)
        await webui.put(trial("T1", 0, experiment_id="old"), trial("T2", 0, experiment_id="new"))
        _, update = (await events.until(lambda e, d: e == "update"))[-1]
        assert [t["id"] for t in update["trials"]] == ["T2"]  # only the experiment shown


async def test_changes_reach_browsers_in_batches(webui: Webui) -> None:
    await webui.put(experiment())
    async with webui.events("/api/events?experiment=exp1") as events:
        await events.next()
        await asyncio.gather(*(webui.put(trial(f"T{i}", i)) for i in range(200)))
        updates = []
        while sum(d["changed"] for d in updates) < 200:
            event, data = await events.next()
            if event == "update":
                updates.append(data)
        assert len(updates) < 20, "trial changes are coalesced, not sent one by one"
        assert updates[-1]["experiment"]["trialCounts"]["WAITING"] == 200
        # a frame carries at most INLINE_ROWS rows: past that, a hint that the rows shown are stale
        assert all(len(d["trials"]) <= 50 and d["stale"] == (d["changed"] > 50) for d in updates)
        await webui.put(trial("T7", 7, status=TrialStatus.RUNNING))
        _, update = (await events.until(lambda e, d: e == "update" and d["trials"]))[-1]
        assert update["trials"][0]["status"] == "RUNNING" and update["experiment"]["trialCounts"]["RUNNING"] == 1


async def test_a_trials_curve_streams_its_history_then_new_records(webui: Webui) -> None:
    await webui.put(experiment(), trial("T1", 0, status=TrialStatus.RUNNING))
    await eventually(lambda: _ok(webui, "/api/trials/T1"))
    for sequence in range(3):
        await webui.metric("T1", sequence, sequence / 10)
    await webui.metric("T1", 1, 0.1)  # a resend: shown once
    async with webui.events("/api/trials/T1/metrics/stream") as events:
        _, history = await events.next()
        assert [(p["sequence"], p["default"]) for p in history] == [(0, 0.0), (1, 0.1), (2, 0.2)]
        await webui.metric("T1", 3, {"default": 0.3, "loss": 2})
        await webui.metric("T1", 0, {"default": 0.9}, kind="FINAL")
        points = []
        while len(points) < 2:
            points += (await events.next())[1]
        assert [(p["type"], p["default"]) for p in points] == [("PERIODICAL", 0.3), ("FINAL", 0.9)]
    listed = (await webui.http.get("/api/trials/T1/metrics")).json()
    assert len(listed) == 5 and listed[3]["value"] == {"default": 0.3, "loss": 2}


async def test_a_long_curve_is_cut_down_to_the_points_asked_for_with_its_extremes(webui: Webui) -> None:
    # Given a trial that reported 400 results, one spike and one dip among them, and its final
    await webui.put(experiment(), trial("T1", 0, status=TrialStatus.RUNNING))
    await eventually(lambda: _ok(webui, "/api/trials/T1"))
    values = {s: 5.0 + (s % 7) / 10 for s in range(400)} | {123: 99.0, 321: -42.0}
    await asyncio.gather(*(webui.metric("T1", s, v) for s, v in values.items()))
    await webui.metric("T1", 0, 6.0, kind="FINAL")

    # When a chart asks for 40 points
    listed = (await webui.http.get("/api/trials/T1/metrics", params={"points": 40})).json()
    async with webui.events("/api/trials/T1/metrics/stream?points=40") as events:
        # (history first: the records that came before a frame's time are sent as they are, then the cut curve)
        _, streamed = (await events.until(lambda e, d: e == "curve" and any(p["sequence"] == 399 for p in d)))[-1]
        # and more results come while it is open
        await webui.metric("T1", 400, 150.0)
        _, later = (await events.until(lambda e, d: e == "curve" and any(p["default"] == 150.0 for p in d)))[-1]

    # Then it gets at most 40 intermediate results, in order, the first, last, spike and dip among them
    for records in (listed, streamed, later):
        line = [(p["sequence"], p["default"]) for p in records if p["type"] == "PERIODICAL"]
        assert len(line) <= 40 and line == sorted(line) and line[0] == (0, 5.0)
        assert (123, 99.0) in line and (321, -42.0) in line
        assert [p["default"] for p in records if p["type"] == "FINAL"] == [6.0]
    assert later[-2]["sequence"] == 400, "the newest result is kept, before the final"
    everything = (await webui.http.get("/api/trials/T1/metrics")).json()
    assert len(everything) == 402, "without points: every record"
    assert (await webui.http.get("/api/trials/T1/metrics", params={"points": "3"})).status_code == 400


async def test_a_retried_trials_curve_keeps_each_attempts_records(webui: Webui) -> None:
    # Given a trial whose first attempt reported 3 results and failed, and whose second reports its own from 0
    await webui.put(experiment(), trial("T1", 0, status=TrialStatus.RUNNING, attempt=1))
    await eventually(lambda: _ok(webui, "/api/trials/T1"))
    for sequence in range(3):
        await webui.metric("T1", sequence, sequence / 10)
    await webui.metric("T1", 0, 5.0, attempt=1)

    # When a browser opens the trial's curve
    async with webui.events("/api/trials/T1/metrics/stream") as events:
        _, history = await events.next()
        # then it gets both attempts' records, each with its attempt: a retry's sequence 0 is not a resend
        assert [(p["attempt"], p["sequence"], p["default"]) for p in history] == [
            (0, 0, 0.0), (0, 1, 0.1), (0, 2, 0.2), (1, 0, 5.0)]
        # and the second attempt's records as they come
        await webui.metric("T1", 1, 6.0, attempt=1)
        await webui.metric("T1", 0, 7.0, kind="FINAL", attempt=1)
        points = []
        while len(points) < 2:
            points += (await events.next())[1]
        assert [(p["attempt"], p["type"], p["sequence"], p["default"]) for p in points] == [
            (1, "PERIODICAL", 1, 6.0), (1, "FINAL", 0, 7.0)]
    listed = (await webui.http.get("/api/trials/T1/metrics")).json()
    assert [(p["attempt"], p["sequence"]) for p in listed if p["type"] == "PERIODICAL"] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


async def test_a_trials_row_shows_its_attempts(webui: Webui) -> None:
    ended = {"attempt": 0, "platform": "local-gpu", "replica": "host-a", "startTime": START.isoformat(),
             "endTime": (START + timedelta(seconds=3)).isoformat(), "status": "FAILED", "exitCode": 1,
             "failure": "trial", "message": "exited with code 1"}  # fmt: skip
    retry_at = START + timedelta(seconds=30)
    await webui.put(experiment(), trial("T1", 0, attempt=1, attempts=[ended], retry_at=retry_at,
                                        message="attempt 0 failed; attempt 1 starts in 30s"))  # fmt: skip
    row = await eventually(lambda: _json(webui, "/api/trials/T1"))
    assert (row["attempt"], row["status"], row["retryAt"]) == (1, "WAITING", "2026-01-01T00:00:30Z")
    assert row["attempts"] == [{**ended, "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T00:00:03Z"}]
    async with webui.events("/api/events?experiment=exp1") as events:
        _, snapshot = await events.next()
    assert snapshot["trials"][0]["attempts"][0]["failure"] == "trial" and snapshot["total"] == 1


async def _json(webui: Webui, path: str) -> Any:
    answer = await webui.http.get(path)
    return answer.json() if answer.status_code == 200 else None


async def test_actions_relay_the_dispatchers_answers(webui: Webui, bus: Bus) -> None:
    asked: list[tuple[str, dict]] = []

    async def dispatcher(msg) -> None:
        body = json.loads(msg.data)
        asked.append((msg.subject, body))
        if msg.subject.endswith("trial.cancel"):
            reply = {"ok": False, "status": 409, "error": f"trial {body['id']} already ended SUCCEEDED"}
        else:
            reply = {"ok": True, "result": {"id": body["id"], "status": "STOPPED", "config": {"secret": "x"}}}
        await msg.respond(orjson.dumps(reply))

    for op in ("trial.cancel", "experiment.stop"):
        await bus.nc.subscribe(subjects.api(op), cb=dispatcher)
    cancel = await webui.http.post("/api/trials/T9/cancel")
    assert (cancel.status_code, cancel.json()) == (409, {"error": "trial T9 already ended SUCCEEDED"})
    stop = await webui.http.post("/api/experiments/exp1/stop")
    assert (stop.status_code, stop.json()) == (200, {"id": "exp1", "status": "STOPPED"})
    assert asked == [(subjects.api("trial.cancel"), {"id": "T9"}), (subjects.api("experiment.stop"), {"id": "exp1"})]

    for action in ("cancel", "retry"):
        foreign = await webui.http.post(f"/api/trials/T9/{action}", headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403 and "cross-site" in foreign.json()["error"], action
    bad = await webui.http.get("/api/trials/T9/log", params={"maxBytes": "lots"})
    assert bad.status_code == 400 and "maxBytes" in bad.json()["error"]
    assert len(asked) == 2, "refused requests change nothing"
    nobody = await webui.http.get("/api/trials/T9/log")  # no dispatcher answers trial.log here
    assert nobody.status_code == 503 and "no dispatcher is running" in nobody.json()["error"]


async def test_a_retry_is_relayed_with_the_dispatchers_answer(webui: Webui, bus: Bus) -> None:
    asked: list[tuple[str, dict]] = []

    async def dispatcher(msg) -> None:
        body = json.loads(msg.data)
        asked.append((msg.subject, body))
        if body["id"] == "T1":
            reply = {"ok": False, "status": 409, "error": "trial T1 is RUNNING: only a trial that has ended can be "
                                                         "retried (cancel it first to start it over)"}  # fmt: skip
        else:
            reply = {"ok": True, "result": {"id": body["id"], "status": "WAITING", "attempt": 1}}
        await msg.respond(orjson.dumps(reply))

    await bus.nc.subscribe(subjects.api("trial.retry"), cb=dispatcher)
    retried = await webui.http.post("/api/trials/T9/retry")
    assert (retried.status_code, retried.json()) == (200, {"id": "T9", "status": "WAITING", "attempt": 1})
    running = await webui.http.post("/api/trials/T1/retry")
    assert running.status_code == 409 and "only a trial that has ended" in running.json()["error"]
    assert asked == [(subjects.api("trial.retry"), {"id": "T9"}), (subjects.api("trial.retry"), {"id": "T1"})]
    assert (await webui.http.get("/api/trials/T9/retry")).status_code == 405
    described = (await webui.http.get("/api/openapi.json")).json()["paths"]["/api/trials/{trial_id}/retry"]["post"]
    assert {"401", "403", "404", "409"} <= set(described["responses"])


async def test_retry_needs_the_full_token_from_this_site_as_cancel_does(bus: Bus, nats_server) -> None:
    asked: list[str] = []

    async def dispatcher(msg) -> None:
        asked.append(msg.subject)
        await msg.respond(orjson.dumps({"ok": True, "result": {"id": "T9", "status": "WAITING", "attempt": 1}}))

    for op in ("trial.cancel", "trial.retry"):
        await bus.nc.subscribe(subjects.api(op), cb=dispatcher)
    async with running(bus, nats_server.url, api_token=TOKEN, api_read_token=READ_TOKEN) as webui:
        for action in ("cancel", "retry"):
            # Given no token, a page of another site with the full token's session, and the read-only token
            anonymous = await webui.http.post(f"/api/trials/T9/{action}")
            assert anonymous.status_code == 401 and "/login?token=" in anonymous.json()["error"], action
            full = {"Authorization": f"Bearer {TOKEN}"}
            foreign = await webui.http.post(f"/api/trials/T9/{action}",
                                            headers={**full, "Origin": "http://evil.example"})  # fmt: skip
            assert foreign.status_code == 403 and "cross-site" in foreign.json()["error"], action
            read_only = await webui.http.post(f"/api/trials/T9/{action}",
                                              headers={"Authorization": f"Bearer {READ_TOKEN}"})  # fmt: skip
            assert read_only.status_code == 403 and "read-only token" in read_only.json()["error"], action
        # and the read-only session's cookie
        assert (await webui.http.get("/login", params={"token": READ_TOKEN})).status_code == 303
        for action in ("cancel", "retry"):
            refused = await webui.http.post(f"/api/trials/T9/{action}")
            assert refused.status_code == 403 and "read-only token" in refused.json()["error"], action
        assert asked == [], "nothing reached the dispatcher"

        # Then the full token's session may retry, from this site
        await webui.http.get("/login", params={"token": TOKEN})
        retried = await webui.http.post("/api/trials/T9/retry", headers={"Origin": webui.url})
        assert (retried.status_code, retried.json()["attempt"]) == (200, 1)
        assert asked == [subjects.api("trial.retry")]


async def test_with_a_token_every_page_and_call_needs_it(bus: Bus, nats_server, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    async with running(bus, nats_server.url, api_token=TOKEN) as webui:
        await webui.put(experiment())
        refused = await webui.http.get("/api/experiments")
        assert refused.status_code == 401 and "/login?token=" in refused.json()["error"]
        page = await webui.http.get("/")
        assert page.status_code == 401 and "text/html" in page.headers["content-type"] and "/login" in page.text
        wrong = await webui.http.get("/api/experiments", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "wrong bearer token" in wrong.json()["error"]
        bearer = await webui.http.get("/api/experiments", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200
        assert (await webui.http.get("/healthz")).status_code == 200
        assert (await webui.http.get("/static/style.css")).status_code == 200  # no data: the 401 page's style

        assert (await webui.http.get("/login", params={"token": "nope"})).status_code == 401
        assert (await webui.http.get("/login")).status_code == 400
        login = await webui.http.get("/login", params={"token": TOKEN})
        assert login.status_code == 303 and login.headers["location"] == "/"
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert TOKEN not in cookie, "the cookie opens the web UI only, it is not the API token"
        assert (await webui.http.get("/")).status_code == 200  # the client keeps the cookie
        async with webui.events("/api/events") as events:
            assert (await events.next())[1]["experiment"]["id"] == "exp1"
    ours = [r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]  # the client's own
    assert ours and not any(TOKEN in line for line in ours)


async def test_a_read_only_session_sees_everything_and_changes_nothing(bus: Bus, nats_server) -> None:
    asked: list[str] = []

    async def dispatcher(msg) -> None:
        asked.append(msg.subject)
        await msg.respond(orjson.dumps({"ok": True, "result": {"id": "T9", "status": "USER_CANCELED"}}))

    await bus.nc.subscribe(subjects.api("trial.cancel"), cb=dispatcher)
    async with running(bus, nats_server.url, api_token=TOKEN, api_read_token=READ_TOKEN) as webui:
        await webui.put(experiment())
        login = await webui.http.get("/login", params={"token": READ_TOKEN})
        assert login.status_code == 303
        assert (await webui.http.get("/api/experiments")).status_code == 200
        refused = await webui.http.post("/api/trials/T9/cancel")
        assert refused.status_code == 403 and "read-only token" in refused.json()["error"]
        assert asked == [], "nothing reached the dispatcher"
        # DNS rebinding: a page whose name now points here sends its own name as Host
        rebound = await webui.http.get("/api/experiments", headers={"Host": "evil.example:8082"})
        assert rebound.status_code == 400 and "does not answer to Host" in rebound.json()["error"]
        page = await webui.http.get("/login", params={"token": TOKEN}, headers={"Host": "evil.example"})
        assert page.status_code == 400 and "set-cookie" not in page.headers
        # the full token's session may act
        await webui.http.get("/login", params={"token": TOKEN})
        assert (await webui.http.post("/api/trials/T9/cancel")).status_code == 200 and asked


async def test_unreadable_entries_are_skipped_without_showing_their_values(webui: Webui, bus: Bus, caplog) -> None:
    await (await bus.kv("experiments")).put("broken", b'{"id": "broken", "password": "hunter2-secret"}')
    await webui.put(experiment())
    await eventually(lambda: _ok(webui, "/api/experiments/exp1"))
    assert "skipping unreadable experiments entry broken" in caplog.text
    assert "hunter2-secret" not in caplog.text
    assert (await webui.http.get("/api/experiments/broken")).status_code == 404
