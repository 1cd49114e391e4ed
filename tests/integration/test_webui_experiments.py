"""The "All experiments" routes of the web UI against a real nats-server: the list from the
buckets with what it refuses, the export as a download, and resume and delete relayed to the
dispatcher with its answers (the page itself: tests/e2e/test_webui_experiments.py)."""

from __future__ import annotations

import csv
import io
import json

import orjson

from contracts import TrialStatus, subjects
from services.common.bus import Bus
from tests.fixtures.webui import Webui, bus_fixture, eventually, json_if, webui_fixture  # noqa: F401 - fixtures
from tests.unit.test_webui_model import experiment, trial


async def test_the_list_the_export_and_the_relayed_actions(webui: Webui, bus: Bus) -> None:
    await webui.put(
        experiment(),
        trial("T1", 0, status=TrialStatus.SUCCEEDED, final_metric=0.5, parameters={"lr": 0.1}),
        trial("T2", 1, status=TrialStatus.FAILED, parameters={"lr": 0.2}),
    )
    rows = await eventually(lambda: json_if(webui, "/api/experiments", lambda b: b and b[0]["trialCount"] == 2))
    assert rows[0]["trialCounts"]["FAILED"] == 1 and rows[0]["best"] == 0.5 and rows[0]["mayChange"] is True
    for bad in ("sort=size", "order=up", "status=PAUSED"):
        refused = await webui.http.get(f"/api/experiments?{bad}")
        assert refused.status_code == 400 and "must be" in refused.json()["error"], bad

    # the export: NNI's records as a file, JSON or CSV
    exported = await webui.http.get("/api/experiments/exp1/export")
    assert exported.headers["content-disposition"] == 'attachment; filename="exp1-trials.json"'
    assert [(r["trialJobId"], r["value"], r["status"]) for r in exported.json()] == [
        ("T1", "0.5", "SUCCEEDED"),
        ("T2", None, "FAILED"),
    ]
    table = await webui.http.get("/api/experiments/exp1/export", params={"format": "csv"})
    assert table.headers["content-type"].startswith("text/csv")
    assert list(csv.DictReader(io.StringIO(table.text)))[0] == {
        "lr": "0.1",
        "reward": "0.5",
        "trialJobId": "T1",
        "status": "SUCCEEDED",
    }
    assert (await webui.http.get("/api/experiments/exp1/export?format=xml")).status_code == 400
    assert (await webui.http.get("/api/experiments/nosuch/export")).status_code == 404

    # resume and delete: the dispatcher's answers, relayed as they are
    asked: list[tuple[str, dict]] = []

    async def dispatcher(msg) -> None:
        asked.append((msg.subject, json.loads(msg.data)))
        if msg.subject.endswith("delete"):
            reply = {"ok": False, "status": 409, "error": "experiment exp1 is RUNNING: stop it first"}
        else:
            reply = {"ok": True, "result": {"id": "exp1", "status": "RUNNING"}}
        await msg.respond(orjson.dumps(reply))

    for op in ("experiment.resume", "experiment.delete"):
        await bus.nc.subscribe(subjects.api(op), cb=dispatcher)
    resumed = await webui.http.post("/api/experiments/exp1/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "RUNNING"
    deleted = await webui.http.post("/api/experiments/exp1/delete")
    assert deleted.status_code == 409 and deleted.json()["error"] == "experiment exp1 is RUNNING: stop it first"
    assert asked == [
        (subjects.api("experiment.resume"), {"id": "exp1"}),
        (subjects.api("experiment.delete"), {"id": "exp1"}),
    ]
