"""The all-curves chart and the compare view's reads against a real nats-server: the web UI
follows the METRICS stream, ranks trials at a step and puts trials side by side."""

from __future__ import annotations

from contracts import TrialStatus
from tests.fixtures.webui import (  # noqa: F401 - fixtures: bus, webui
    Webui,
    bus_fixture,
    eventually,
    json_if,
    ok,
    webui_fixture,
)
from tests.unit.test_webui_intermediate import CURVES
from tests.unit.test_webui_model import experiment, local_config, trial


async def test_the_chart_ranks_trials_at_a_step_and_compares_two(webui: Webui) -> None:
    # Given four trials whose ranking at step 1 is not their ranking at the end (maximize)
    await webui.put(
        experiment(),
        *(
            trial(t, i, status=TrialStatus.SUCCEEDED, parameters={"lr": 0.1 * (i + 1), "layers": 2})
            for i, t in enumerate(CURVES)
        ),
    )
    await eventually(lambda: ok(webui, "/api/trials/D"), 20)
    for t, values in CURVES.items():
        for step, value in enumerate(values):
            await webui.metric(t, step, {"default": value, "loss": 1 - value})

    # When the chart is read without and with a step
    chart = await eventually(
        lambda: json_if(
            webui,
            "/api/experiments/exp1/intermediate?trials=2",
            lambda b: b["reported"] == 4 and sum(len(c["points"]) for c in b["curves"]) == 6,
        ),
        20,
    )
    ranked = (await webui.http.get("/api/experiments/exp1/intermediate?trials=2&step=1&top=4")).json()

    # Then it draws the two best by their latest result, and ranks all four at step 1
    assert [c["trialId"] for c in chart["curves"]] == ["D", "B"]
    assert chart["curves"][0]["points"] == [[0, 0.1], [1, 0.2], [2, 0.95]]
    assert "2 trials with the best latest" in chart["rule"] and chart["optimizeMode"] == "maximize"
    assert [(r["trialId"], r["value"], r["sequenceId"]) for r in ranked["ranking"]] == [
        ("A", 0.9, 0),
        ("C", 0.7, 2),
        ("B", 0.5, 1),
        ("D", 0.2, 3),
    ]

    # and two trials compared come with their parameters and curves, in the order asked
    compared = (await webui.http.get("/api/experiments/exp1/compare?trials=B,A,nosuch")).json()
    assert [t["id"] for t in compared["trials"]] == ["B", "A"] and compared["missing"] == ["nosuch"]
    assert compared["trials"][1]["parameters"] == {"lr": 0.1, "layers": 2}
    assert [p[1] for p in compared["trials"][1]["curve"]["points"]] == [0.1, 0.9, 0.3]
    for bad in ("/compare", "/compare?trials=" + ",".join(f"T{i}" for i in range(21)), "/intermediate?step=x"):
        assert (await webui.http.get(f"/api/experiments/exp1{bad}")).status_code == 400, bad
    assert (await webui.http.get("/api/experiments/nosuch/intermediate")).status_code == 404


async def test_minimize_ranks_the_lowest_first(webui: Webui) -> None:
    await webui.put(experiment(config=local_config(tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}})))
    await webui.put(*(trial(t, i) for i, t in enumerate(CURVES)))
    for t, values in CURVES.items():
        for step, value in enumerate(values):
            await webui.metric(t, step, value)
    ranked = await eventually(
        lambda: json_if(webui, "/api/experiments/exp1/intermediate?step=1&top=2", lambda b: b["rankedOf"] == 4), 20
    )
    assert [r["trialId"] for r in ranked["ranking"]] == ["D", "B"]
    assert [c["trialId"] for c in ranked["curves"]][:2] == ["A", "C"]
