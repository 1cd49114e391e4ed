"""The web UI's analysis routes against a real nats-server: hyper-parameters and durations come
from the buckets, bad query strings are refused with what to send, unknown experiments get 404,
and the token guards them like every other read (docs/webui.md)."""

from __future__ import annotations

from datetime import timedelta

from contracts import TrialStatus
from services.common.bus import Bus
from tests.fixtures.webui import (  # noqa: F401 - fixtures: bus, webui
    TOKEN,
    Webui,
    bus_fixture,
    eventually,
    json_if,
    running,
    webui_fixture,
)
from tests.unit.test_webui_model import START, experiment, local_config, trial

SPACE = {"opt": {"_type": "choice", "_value": [{"_name": "sgd", "lr": {"_type": "uniform", "_value": [0, 1]}}]}}


async def test_hyper_parameters_and_durations_come_from_the_buckets(webui: Webui) -> None:
    await webui.put(
        experiment(config=local_config(searchSpace=SPACE)),
        *(
            trial(
                f"T{i}",
                i,
                status=TrialStatus.SUCCEEDED,
                final_metric=i / 10,
                parameters={"opt": {"_name": "sgd", "lr": i / 10}},
                start_time=START,
                end_time=START + timedelta(seconds=i),
            )
            for i in range(10)
        ),
    )
    view = await eventually(
        lambda: json_if(webui, "/api/experiments/exp1/hyper-parameters?top=20", lambda b: b["withMetric"] == 10)
    )
    assert [line["id"] for line in view["lines"]] == ["T9", "T8"], "maximize: the highest two of ten"
    assert [axis["name"] for axis in view["axes"]] == ["opt/_name", "opt/lr", "final metric"]
    durations = (await webui.http.get("/api/experiments/exp1/durations?bins=3")).json()
    assert durations["count"] == 10 and [b["count"] for b in durations["bins"]] == [3, 3, 4]
    assert durations["running"] == 0


async def test_bad_queries_and_unknown_experiments_are_refused(webui: Webui) -> None:
    await webui.put(experiment())
    await eventually(lambda: json_if(webui, "/api/experiments/exp1", lambda b: b["id"] == "exp1"))
    for path, said in (
        ("hyper-parameters?top=0", "top must be a whole number from 1 to 100, not '0'"),
        ("hyper-parameters?lines=2001", "lines must be a whole number from 1 to 2000, not '2001'"),
        ("durations?bins=x", "bins must be a whole number from 1 to 200, not 'x'"),
    ):
        answer = await webui.http.get(f"/api/experiments/exp1/{path}")
        assert (answer.status_code, answer.json()["error"]) == (400, said)
    missing = await webui.http.get("/api/experiments/nosuch/hyper-parameters")
    assert missing.status_code == 404 and "nosuch" in missing.json()["error"]
    schema = (await webui.http.get("/api/openapi.json")).json()["paths"]
    assert {"/api/experiments/{experiment_id}/hyper-parameters", "/api/experiments/{experiment_id}/durations"} <= set(
        schema
    )


async def test_the_token_guards_them(bus: Bus, nats_server) -> None:
    async with running(bus, nats_server.url, api_token=TOKEN) as webui:
        await webui.put(experiment())
        for path in ("hyper-parameters", "durations"):
            assert (await webui.http.get(f"/api/experiments/exp1/{path}")).status_code == 401
