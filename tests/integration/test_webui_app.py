"""The web UI service against a real nats-server: what it serves from the buckets, live updates,
auth, 404s, secrets, and actions relayed to the dispatcher (its tables and curves at size:
``test_webui_data.py``)."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta

import orjson

from contracts import TrialStatus, subjects
from services.common.bus import Bus
from tests.fixtures.webui import (  # noqa: F401 - fixtures: bus, webui
    READ_TOKEN,
    TOKEN,
    Webui,
    bus_fixture,
    eventually,
    ok,
    running,
    webui_fixture,
)
from tests.unit.test_webui_model import PAI_TOKEN, START, experiment, local_config, openpai_config, trial


async def test_the_overview_and_rows_come_from_the_buckets(bus: Bus, nats_server) -> None:
    minimize = experiment(config=local_config(tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}))
    await (await bus.kv("experiments")).put("exp1", minimize.encode())
    await (await bus.kv("trials")).put("T1", trial("T1", 0, status=TrialStatus.SUCCEEDED, final_metric=0.7).encode())
    async with running(bus, nats_server.url) as webui:  # what was there before it started
        await webui.put(
            trial("T2", 1, status=TrialStatus.SUCCEEDED, final_metric={"default": 0.2, "acc": 0.9}),
            trial("T3", 2, status=TrialStatus.RUNNING),
        )  # and what came after

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


async def test_secrets_never_leave_the_web_ui(webui: Webui) -> None:
    await webui.put(experiment(config=openpai_config()), trial("T1", 0))
    await eventually(lambda: ok(webui, "/api/trials/T1"))
    answers = [
        await webui.http.get(path)
        for path in (
            "/",
            "/experiments/exp1",
            "/api/experiments",
            "/api/experiments/exp1",
            "/api/experiments/exp1/trials",
            "/api/trials/T1",
            "/static/app.js",
        )
    ]
    async with webui.events("/api/events?experiment=exp1") as events:
        _, snapshot = await events.next()
    shown = "".join(a.text for a in answers) + json.dumps(snapshot)
    assert all(a.status_code == 200 for a in answers)
    assert PAI_TOKEN not in shown and "sealed:v1:" not in shown
    assert snapshot["experiment"]["config"]["trainingService"]["token"] == "**********"


async def test_unknown_ids_get_404s_that_name_them(webui: Webui) -> None:
    page = await webui.http.get("/experiments/nosuch42")
    assert page.status_code == 404 and "text/html" in page.headers["content-type"] and "nosuch42" in page.text
    for path in (
        "/api/experiments/nosuch42",
        "/api/experiments/nosuch42/trials",
        "/api/events?experiment=nosuch42",
        "/api/trials/nosuch42",
        "/api/trials/nosuch42/metrics",
        "/api/trials/nosuch42/metrics/stream",
    ):
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
    for lots in ("lots", "²"):  # "²" is a digit to str.isdigit, not to int()
        bad = await webui.http.get("/api/trials/T9/log", params={"maxBytes": lots})
        assert bad.status_code == 400 and "maxBytes" in bad.json()["error"]
    bad = await webui.http.get("/api/trials/T9/log", params={"attempt": "³"})
    assert bad.status_code == 400 and "attempt" in bad.json()["error"]
    assert len(asked) == 2, "refused requests change nothing"
    nobody = await webui.http.get("/api/trials/T9/log")  # no dispatcher answers trial.log here
    assert nobody.status_code == 503 and "no dispatcher is running" in nobody.json()["error"]


async def test_a_retry_is_relayed_with_the_dispatchers_answer(webui: Webui, bus: Bus) -> None:
    asked: list[tuple[str, dict]] = []

    async def dispatcher(msg) -> None:
        body = json.loads(msg.data)
        asked.append((msg.subject, body))
        if body["id"] == "T1":
            reply = {
                "ok": False,
                "status": 409,
                "error": "trial T1 is RUNNING: only a trial that has ended can be "
                "retried (cancel it first to start it over)",
            }
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
            foreign = await webui.http.post(
                f"/api/trials/T9/{action}", headers={**full, "Origin": "http://evil.example"}
            )
            assert foreign.status_code == 403 and "cross-site" in foreign.json()["error"], action
            read_only = await webui.http.post(
                f"/api/trials/T9/{action}", headers={"Authorization": f"Bearer {READ_TOKEN}"}
            )
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
    await eventually(lambda: ok(webui, "/api/experiments/exp1"))
    assert "skipping unreadable experiments entry broken" in caplog.text
    assert "hunter2-secret" not in caplog.text
    assert (await webui.http.get("/api/experiments/broken")).status_code == 404


async def test_the_queue_and_the_teams_are_the_dispatchers_answers_relayed(bus: Bus, nats_server) -> None:
    queue = [
        {
            "platform": "local-gpu",
            "capacity": {"gpus": 1.0, "trials": None},
            "used": {"gpus": 1.0, "trials": 1},
            "waiting": [
                {
                    "position": 1,
                    "experiment": "exp2",
                    "team": "nlp",
                    "priority": 0,
                    "gpusPerTrial": 1.0,
                    "ready": 1,
                    "why": "waiting for 1 free GPU (0 of 1 GPUs of local-gpu free)",
                }
            ],
        }
    ]
    teams = [{"name": "nlp", "weight": 1.0, "quota": {"gpus": None, "trials": None}, "configured": False, "use": {}}]
    asked: list[tuple[str, str | None]] = []

    async def dispatcher(msg) -> None:
        asked.append((msg.subject, (msg.headers or {}).get("Authorization")))
        await msg.respond(orjson.dumps({"ok": True, "result": queue if msg.subject.endswith("queue") else teams}))

    async with running(bus, nats_server.url, api_token=TOKEN) as webui:
        # Given no token, both are refused as every /api route is, and the dispatcher is not asked
        for path in ("/api/queue", "/api/teams"):
            refused = await webui.http.get(path)
            assert refused.status_code == 401 and "/login?token=" in refused.json()["error"], path
        # And while no dispatcher answers, they say so (503)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        nobody = await webui.http.get("/api/queue", headers=auth)
        assert nobody.status_code == 503 and "no dispatcher is running" in nobody.json()["error"]

        async def silence(msg) -> None:
            pass  # a dispatcher too busy to answer

        silent = await bus.nc.subscribe(subjects.api("team.list"), cb=silence)
        late = await webui.http.get("/api/teams", headers=auth)
        assert late.status_code == 503 and "did not answer team.list" in late.json()["error"]
        await silent.unsubscribe()
        # When the dispatcher answers, its answers come as they are, asked as the web UI (the stack's token)
        for op in ("queue", "team.list"):
            await bus.nc.subscribe(subjects.api(op), cb=dispatcher)
        assert (await webui.http.get("/api/queue", headers=auth)).json() == queue
        assert (await webui.http.get("/api/teams", headers=auth)).json() == teams
        assert asked == [(subjects.api("queue"), None), (subjects.api("team.list"), None)]
        # And the page has its own address
        assert (await webui.http.get("/queue", headers=auth)).status_code == 200
