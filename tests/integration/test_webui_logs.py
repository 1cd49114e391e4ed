"""The experiment's own logs in the web UI against a real nats-server: a service's lines about an experiment go
to the LOGS stream (services/common/buslog.py), the web UI answers the last ones and follows new ones, bounded by
the stream's limit; and what Add trial refuses before asking the dispatcher."""

from __future__ import annotations

import asyncio
import logging

import orjson

from contracts import streams
from services.common import buslog
from services.common.bus import Bus
from tests.fixtures.webui import Webui, bus_fixture, eventually, ok, webui_fixture  # noqa: F401 - fixtures
from tests.unit.test_webui_model import experiment, local_config

log = logging.getLogger("services.dispatcher.test")


async def test_a_service_s_lines_about_an_experiment_reach_the_web_ui_last_first_then_live(
    webui: Webui, bus: Bus
) -> None:
    await webui.put(experiment(config=local_config()))
    await eventually(lambda: ok(webui, "/api/experiments/exp1"))
    handler = buslog.install(bus, "dispatcher")
    assert handler is not None and buslog.install(bus, "gateway") is None  # only the dispatcher's and tuner's
    log.setLevel(logging.INFO)  # as the services run (pytest leaves the root logger at WARNING)
    try:
        for i in range(5):
            log.info("experiment %s: line %d", "exp1", i)
        log.info("experiment %s: another experiment's line", "exp2")
        log.info("a line about no experiment")

        async def five() -> list | None:
            answer = await webui.http.get("/api/experiments/exp1/logs")
            lines = answer.json()["lines"] if answer.status_code == 200 else []
            return lines if len(lines) == 5 else None

        lines = await eventually(five)
        assert [line["message"] for line in lines] == [f"experiment exp1: line {i}" for i in range(5)]
        assert {(line["service"], line["level"], line["logger"]) for line in lines} == {
            ("dispatcher", "INFO", "services.dispatcher.test")
        }
        last = (await webui.http.get("/api/experiments/exp1/logs", params={"lines": 2})).json()["lines"]
        assert [line["message"] for line in last] == ["experiment exp1: line 3", "experiment exp1: line 4"]
        assert (await webui.http.get("/api/experiments/exp1/logs", params={"lines": 0})).status_code == 400
        assert (await webui.http.get("/api/experiments/nope/logs")).status_code == 404

        # the stream: the last lines, then the new ones as they are logged (from another thread too)
        async with webui.events("/api/experiments/exp1/logs/stream?lines=3") as events:
            event, data = await events.next()
            assert event == "lines" and data["history"] and len(data["lines"]) == 3
            await asyncio.to_thread(log.warning, "experiment %s: from a tuner's thread", "exp1")
            event, data = await events.next()
            assert event == "lines" and [(x["level"], x["message"]) for x in data["lines"]] == [
                ("WARNING", "experiment exp1: from a tuner's thread")
            ]
    finally:
        handler.stop()
        log.setLevel(logging.NOTSET)


async def test_the_stream_keeps_the_last_lines_of_each_service_and_experiment(bus: Bus) -> None:
    for i in range(streams.LOG_LINES_PER_SUBJECT + 10):
        await bus.js.publish("logs.big.tuner", orjson.dumps({"message": str(i)}))  # acknowledged: stored
    await bus.js.publish("logs.big.dispatcher", b"{}")
    info = await bus.js.stream_info(streams.stream_name(streams.LOGS), subjects_filter="logs.big.*")
    assert info.state.subjects == {"logs.big.tuner": streams.LOG_LINES_PER_SUBJECT, "logs.big.dispatcher": 1}


async def test_add_trial_refuses_what_is_not_a_json_object_before_asking_the_dispatcher(webui: Webui) -> None:
    await webui.put(experiment(config=local_config()))
    await eventually(lambda: ok(webui, "/api/experiments/exp1"))
    for body, said in [
        (b"[1, 2]", "send the trial's parameters"),
        (b'{"parameters": [1, 2]}', "parameters must be a JSON object of names and values (got an array)"),
        (b'{"parameters": {"x": 1}, "parameterId": 3}', "unknown field(s) parameterId"),
        (b"{not json", "the body is not JSON"),
    ]:
        answer = await webui.http.post("/api/experiments/exp1/trials", content=body)
        assert answer.status_code == 400 and said in answer.json()["error"], answer.text
    assert (await webui.http.post("/api/experiments/nope/trials", json={"parameters": {}})).status_code == 404
    # a well-formed one goes to the dispatcher (none runs here: 503, said so)
    answer = await webui.http.post("/api/experiments/exp1/trials", json={"parameters": {"x": 1}})
    assert answer.status_code == 503 and "no dispatcher" in answer.json()["error"], answer.text
