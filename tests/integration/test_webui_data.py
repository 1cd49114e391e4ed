"""The web UI's tables and curves at size, against a real nats-server: any window of the trial
table sorted and filtered on the server, a trial's row, and curves streamed, cut down to the
points asked for with their extremes, one per attempt."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from contracts import TrialStatus
from tests.fixtures.webui import (  # noqa: F401 - fixtures: bus, webui
    Webui,
    bus_fixture,
    eventually,
    json_if,
    json_of,
    ok,
    webui_fixture,
)
from tests.unit.test_webui_model import START, experiment, trial


async def test_the_table_reads_any_window_sorted_and_filtered_on_the_server(webui: Webui) -> None:
    # Given 300 trials: every third succeeded with a metric, the others are running
    await webui.put(
        experiment(),
        *(
            trial(f"T{i:03d}", i, status=TrialStatus.SUCCEEDED, final_metric=(i * 7) % 100)
            if i % 3 == 0
            else trial(f"T{i:03d}", i, status=TrialStatus.RUNNING)
            for i in range(300)
        ),
    )
    await eventually(lambda: json_if(webui, "/api/experiments/exp1", lambda b: b["trialCount"] == 300), timeout=30)

    async def window(**params: Any) -> dict:
        answer = await webui.http.get("/api/experiments/exp1/trials", params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()

    # When a table asks for its last rows, newest first, best first, or one status
    last = await window(offset=290, limit=50)
    newest = await window(order="desc", limit=2)
    best = await window(sort="metric", limit=3)
    worst = await window(sort="metric", order="desc", limit=1)
    runs = await window(status="RUNNING", offset=195, limit=10)
    # Then each is that slice, with the number of rows under its filter
    assert [r["id"] for r in last["trials"]] == [f"T{i}" for i in range(290, 300)] and last["total"] == 300
    assert [r["id"] for r in newest["trials"]] == ["T299", "T298"]
    assert [r["default"] for r in best["trials"]] == [99, 98, 97] and worst["trials"][0]["default"] == 0
    assert [r["id"] for r in runs["trials"]] == ["T293", "T295", "T296", "T298", "T299"] and runs["total"] == 200
    # and a paging user sees every trial once
    pages = [await window(sort="metric", offset=offset, limit=64) for offset in range(0, 300, 64)]
    seen = [r["id"] for page in pages for r in page["trials"]]
    assert sorted(seen) == sorted(f"T{i:03d}" for i in range(300))
    for bad in (
        {"sort": "name"},
        {"order": "up"},
        {"status": "DONE"},
        {"limit": "0"},
        {"offset": "-1"},
        {"limit": "²"},
        {"offset": "٣"},
    ):  # digits to str.isdigit, not to int()
        refused = await webui.http.get("/api/experiments/exp1/trials", params=bad)
        assert refused.status_code == 400 and next(iter(bad)) in refused.json()["error"], bad

    # and the overview chart holds at most the points asked for, the best and worst among them
    chart = (await webui.http.get("/api/experiments/exp1/chart", params={"points": 20})).json()
    values = [v for _, v in chart["points"]]
    assert len(values) <= 20 and max(values) == 99 and min(values) == 0 and chart["count"] == 100
    assert chart["best"][-1][1] == 99, "maximize: the best so far ends at the highest"


async def test_a_trials_curve_streams_its_history_then_new_records(webui: Webui) -> None:
    await webui.put(experiment(), trial("T1", 0, status=TrialStatus.RUNNING))
    await eventually(lambda: ok(webui, "/api/trials/T1"))
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
    await eventually(lambda: ok(webui, "/api/trials/T1"))
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
    await eventually(lambda: ok(webui, "/api/trials/T1"))
    for sequence in range(3):
        await webui.metric("T1", sequence, sequence / 10)
    await webui.metric("T1", 0, 5.0, attempt=1)

    # When a browser opens the trial's curve
    async with webui.events("/api/trials/T1/metrics/stream") as events:
        _, history = await events.next()
        # then it gets both attempts' records, each with its attempt: a retry's sequence 0 is not a resend
        assert [(p["attempt"], p["sequence"], p["default"]) for p in history] == [
            (0, 0, 0.0),
            (0, 1, 0.1),
            (0, 2, 0.2),
            (1, 0, 5.0),
        ]
        # and the second attempt's records as they come
        await webui.metric("T1", 1, 6.0, attempt=1)
        await webui.metric("T1", 0, 7.0, kind="FINAL", attempt=1)
        points = []
        while len(points) < 2:
            points += (await events.next())[1]
        assert [(p["attempt"], p["type"], p["sequence"], p["default"]) for p in points] == [
            (1, "PERIODICAL", 1, 6.0),
            (1, "FINAL", 0, 7.0),
        ]
    listed = (await webui.http.get("/api/trials/T1/metrics")).json()
    assert [(p["attempt"], p["sequence"]) for p in listed if p["type"] == "PERIODICAL"] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
    ]


async def test_a_trials_row_shows_its_attempts(webui: Webui) -> None:
    ended = {
        "attempt": 0,
        "platform": "local-gpu",
        "replica": "host-a",
        "startTime": START.isoformat(),
        "endTime": (START + timedelta(seconds=3)).isoformat(),
        "status": "FAILED",
        "exitCode": 1,
        "failure": "trial",
        "message": "exited with code 1",
    }
    retry_at = START + timedelta(seconds=30)
    await webui.put(
        experiment(),
        trial(
            "T1", 0, attempt=1, attempts=[ended], retry_at=retry_at, message="attempt 0 failed; attempt 1 starts in 30s"
        ),
    )
    row = await eventually(lambda: json_of(webui, "/api/trials/T1"))
    assert (row["attempt"], row["status"], row["retryAt"]) == (1, "WAITING", "2026-01-01T00:00:30Z")
    assert row["attempts"] == [{**ended, "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T00:00:03Z"}]
    async with webui.events("/api/events?experiment=exp1") as events:
        _, snapshot = await events.next()
    assert snapshot["trials"][0]["attempts"][0]["failure"] == "trial" and snapshot["total"] == 1
