"""The web UI's model: best metric (min/max, dict finals), counts, links, and no secret in a view."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts import ExperimentConfig, ExperimentState, TrialState, TrialStatus, sealing
from contracts.state import default_metric
from services.webui.hub import Hub
from services.webui.model import Model, platform_link

START = datetime(2026, 1, 1, tzinfo=UTC)
PAI_TOKEN = "pai-token-never-shown-7f3a"
SSH_PASSWORD = "ssh-password-never-shown-91c2"


def local_config(**overrides: Any) -> dict[str, Any]:
    return {
        "experimentName": "demo",
        "trialCommand": "python3 trial.py",
        "trialConcurrency": 2,
        "trainingService": {"platform": "local"},
        **overrides,
    }


def openpai_config(**service: Any) -> dict[str, Any]:
    return local_config(
        trialGpuNumber=0,
        trainingService={
            "platform": "openpai",
            "host": "pai.example.com",
            "username": "alice",
            "token": PAI_TOKEN,
            "trialCpuNumber": 1,
            "trialMemorySize": "1gb",
            "storageConfigName": "nfs",
            "localStorageMountPoint": "/mnt/l",
            "containerStorageMountPoint": "/mnt/c",
            **service,
        },
    )


def remote_config() -> dict[str, Any]:
    machine = {"host": "10.0.0.5", "user": "bob", "password": SSH_PASSWORD}
    return local_config(trainingService={"platform": "remote", "machineList": [machine]})


def experiment(experiment_id: str = "exp1", config: dict | None = None, start: datetime = START) -> ExperimentState:
    return ExperimentState(
        id=experiment_id, config=ExperimentConfig.model_validate(config or local_config()), start_time=start
    )


def trial(trial_id: str, sequence: int = 0, experiment_id: str = "exp1", **fields: Any) -> TrialState:
    fields.setdefault("platform", "local-gpu")
    return TrialState(id=trial_id, experiment_id=experiment_id, sequence_id=sequence, submit_time=START, **fields)


def model_with(state: ExperimentState, *trials: TrialState) -> Model:
    model = Model()
    model.put_experiment(state)
    for t in trials:
        model.put_trial(t)
    return model


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.5, 0.5),
        (3, 3.0),
        ({"default": 0.25, "loss": 9}, 0.25),
        ({"loss": 1}, None),
        (None, None),
        (True, None),
        ("0.5", None),
        (float("nan"), None),
        ({"default": float("inf")}, None),
    ],
)
def test_the_default_metric_is_the_number_or_the_dicts_default(value, expected):
    assert default_metric(value) == expected


def test_optimize_mode_comes_from_the_tuners_class_args_and_defaults_to_maximize():
    def mode(**config: Any) -> str:
        return ExperimentConfig.model_validate(local_config(**config)).optimize_mode

    assert mode() == "maximize"
    assert mode(tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}) == "minimize"
    assert mode(tuner={"name": "TPE", "class_args": {"optimize_mode": "Minimize"}}) == "minimize"
    assert mode(tuner={"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}) == "maximize"
    assert mode(advisor={"name": "Hyperband", "classArgs": {"optimize_mode": "minimize"}}) == "minimize"
    assert mode(tuner={"name": "Random"}) == "maximize"


@pytest.mark.parametrize(("mode", "best_id", "best_value"), [("maximize", "T2", 0.9), ("minimize", "T3", 0.1)])
def test_the_best_metric_respects_optimize_mode_and_reads_dict_finals(mode, best_id, best_value):
    state = experiment(config=local_config(tuner={"name": "TPE", "classArgs": {"optimize_mode": mode}}))
    model = model_with(
        state,
        trial("T1", 0, status=TrialStatus.SUCCEEDED, final_metric=0.5),
        trial("T2", 1, status=TrialStatus.SUCCEEDED, final_metric={"default": 0.9, "acc": 0.1}),
        trial("T3", 2, status=TrialStatus.SUCCEEDED, final_metric={"default": 0.1}),
        trial("T4", 3, status=TrialStatus.RUNNING, intermediate_count=3),
        trial("T5", 4, status=TrialStatus.FAILED, final_metric={"other": 100}),
    )
    overview = model.overview("exp1")
    assert overview["best"] == {"value": best_value, "trialId": best_id, "sequenceId": int(best_id[1]) - 1}
    assert overview["optimizeMode"] == mode


def test_a_tie_goes_to_the_earlier_trial_and_no_final_means_no_best():
    model = model_with(experiment(), trial("B", 1, final_metric=1.0), trial("A", 0, final_metric=1.0))
    assert model.overview("exp1")["best"]["trialId"] == "A"
    assert model_with(experiment(), trial("C", 0)).overview("exp1")["best"] is None


def test_counts_cover_every_status_and_follow_changes():
    model = model_with(experiment(), trial("T1", 0), trial("T2", 1, status=TrialStatus.RUNNING))
    model.put_trial(trial("T1", 0, status=TrialStatus.RUNNING))
    model.put_trial(trial("T3", 2, status=TrialStatus.USER_CANCELED))
    counts = model.overview("exp1")["trialCounts"]
    assert counts == {s.value: 0 for s in TrialStatus} | {"RUNNING": 2, "USER_CANCELED": 1}
    assert model.overview("exp1")["trialCount"] == 3
    model.delete_trial("T3")
    assert model.overview("exp1")["trialCounts"]["USER_CANCELED"] == 0


@pytest.mark.parametrize("config", [openpai_config(), remote_config()], ids=["openpai-token", "ssh-password"])
def test_no_view_holds_a_secret(config):
    sealing.install(sealing.generate_key())  # the dispatcher writes the bucket
    try:
        stored = experiment(config=config).encode()
    finally:
        sealing.install(None)  # the web UI holds no key
    assert PAI_TOKEN.encode() not in stored and SSH_PASSWORD.encode() not in stored, "the bucket holds it sealed"
    for state in (experiment(config=config), ExperimentState.decode(stored)):  # in clear, and as the web UI reads it
        model = model_with(state, trial("T1", 0, parameters={"lr": 0.1}))
        hub = Hub(model, interval=0.1)
        shown = json.dumps([model.overview("exp1"), model.rows("exp1"), model.summaries()])
        shown += hub.snapshot("exp1").decode()
        assert PAI_TOKEN not in shown and SSH_PASSWORD not in shown and "sealed:v1:" not in shown
        assert "**********" in json.dumps(model.overview("exp1")["config"])


def test_openpai_trials_link_to_their_job_with_the_attempt_after_the_first():
    state = experiment("e1", openpai_config(host="http://pai.local:9186/", username="al ice"))
    first = trial("T1", 0, experiment_id="e1", platform="openpai")
    assert platform_link(state.config, first) == (
        "http://pai.local:9186/job-detail.html?username=al+ice&jobName=trialbus_e1_T1"
    )
    retried = trial("T1", 0, experiment_id="e1", attempt=2, platform="openpai")
    assert platform_link(state.config, retried).endswith("jobName=trialbus_e1_T1_2")
    assert platform_link(experiment().config, trial("T1")) is None
    assert model_with(state, first).rows("e1")[0]["link"].startswith("http://pai.local:9186/job-detail.html")


def test_a_link_is_never_a_script():
    state = experiment("e1", openpai_config(host="javascript://x%0aalert(1)"))
    assert platform_link(state.config, trial("T1", experiment_id="e1", platform="openpai")) is None


def test_rows_come_in_sequence_order_with_replica_and_default():
    model = model_with(
        experiment(),
        trial("B", 1, replica="host-b", final_metric={"default": 2.0}),
        trial("A", 0, parameters={"opt": {"_name": "adam", "lr": 0.1}}),
    )
    rows = model.rows("exp1")
    assert [r["id"] for r in rows] == ["A", "B"]
    assert rows[1]["replica"] == "host-b" and rows[1]["default"] == 2.0 and rows[1]["finalMetric"] == {"default": 2.0}
    assert rows[0]["parameters"] == {"opt": {"_name": "adam", "lr": 0.1}}


def test_newest_is_by_start_time_and_changes_are_taken_once():
    model = Model()
    assert model.newest() is None
    model.put_experiment(experiment("old", start=START))
    model.put_experiment(experiment("new", start=START + timedelta(hours=1)))
    model.put_experiment(experiment("mid", start=START + timedelta(minutes=5)))
    model.put_trial(trial("T1", experiment_id="mid"))
    assert model.newest() == "new"
    assert [s["id"] for s in model.summaries()] == ["new", "mid", "old"]
    changes = model.take_changes()
    assert changes.experiments_list and changes.touched() == {"old", "new", "mid"}
    assert changes.trials == {"mid": {"T1"}}
    assert model.take_changes().touched() == set()


def test_a_trial_before_its_experiment_is_kept_and_shown_once_the_experiment_comes():
    model = Model()
    model.put_trial(trial("T1", final_metric=0.3))
    assert model.overview("exp1") is None and model.trial("T1") is not None
    model.put_experiment(experiment())
    assert model.overview("exp1")["trialCount"] == 1 and model.overview("exp1")["best"]["value"] == 0.3


def test_the_hub_batches_an_experiments_changes_into_one_update():
    model = model_with(experiment())
    hub = Hub(model, interval=0.1)
    stream = hub.open("exp1")
    other = hub.open(None)  # the page at /: follows the newest
    first = stream.queue.get_nowait()
    assert first.startswith(b"retry:") and b"event: snapshot" in first
    hub.flush()  # what changed before the streams opened
    while not stream.queue.empty():
        stream.queue.get_nowait()
    for i in range(50):
        model.put_trial(trial(f"T{i}", i))
    hub.flush()
    frames = [stream.queue.get_nowait() for _ in range(stream.queue.qsize())]
    updates = [f for f in frames if f.startswith(b"event: update")]
    assert len(updates) == 1
    assert len(json.loads(updates[0].split(b"data: ", 1)[1])["trials"]) == 50
    model.put_experiment(experiment("exp2", start=START + timedelta(days=1)))
    hub.flush()
    later = [other.queue.get_nowait() for _ in range(other.queue.qsize())]
    snapshots = [json.loads(f.split(b"data: ", 1)[1]) for f in later if b"event: snapshot" in f]
    assert snapshots[-1]["experiment"]["id"] == "exp2"
    hub.close()
    assert stream.closed and other.closed


def test_trials_before_their_minimizing_experiment_are_ranked_its_way_once_it_comes():
    # The two buckets are watched apart: a trial may be applied before its experiment
    model = Model()
    for i, value in enumerate([0.3, 0.1, 0.2]):
        model.put_trial(trial(f"t{i}", i, status=TrialStatus.SUCCEEDED, final_metric=value))
    assert model.best("exp1").id == "t0"  # maximize until the experiment says otherwise

    minimizing = {"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}
    model.put_experiment(experiment(config=local_config(tuner=minimizing)))

    assert model.best("exp1").id == "t1"
    model.put_trial(trial("t3", 3, status=TrialStatus.SUCCEEDED, final_metric=0.05))
    assert model.best("exp1").id == "t3"


def test_a_deleted_trial_leaves_the_counts_and_the_best():
    model = model_with(
        experiment(),
        trial("t0", 0, status=TrialStatus.SUCCEEDED, final_metric=0.9),
        trial("t1", 1, status=TrialStatus.RUNNING),
    )
    model.delete_trial("t0")
    assert model.best("exp1") is None
    assert (model.counts("exp1")["SUCCEEDED"], model.counts("exp1")["RUNNING"]) == (0, 1)
    model.delete_experiment("exp1")
    assert model.counts("exp1")["RUNNING"] == 0


def test_the_overview_shows_the_first_failures_one_per_line_with_the_log_command():
    missing, other = "ModuleNotFoundError: No module named 'sklearn'", "<script>alert(1)</script>"
    model = model_with(experiment(), trial("t0", 0, status=TrialStatus.RUNNING))
    assert model.overview("exp1")["failures"] == []
    failed = [
        trial("t0", 0, status=TrialStatus.FAILED, exit_code=1, last_error=missing),
        trial("t1", 1, status=TrialStatus.FAILED, exit_code=1, last_error=missing),
        trial("t2", 2, status=TrialStatus.FAILED, exit_code=1),  # no line: nothing to show
        trial("t3", 3, status=TrialStatus.FAILED, exit_code=2, last_error=other),
    ]
    for t in failed:
        model.put_trial(t)
    assert model.overview("exp1")["failures"] == [
        {"trialId": "t0", "sequenceId": 0, "exitCode": 1, "lastError": missing, "log": "trialbus log trial t0"},
        {"trialId": "t3", "sequenceId": 3, "exitCode": 2, "lastError": other, "log": "trialbus log trial t3"},
    ]  # the page writes lastError as text (util.js h(): textContent), so the markup stays text
    model.put_trial(trial("t0", 0, status=TrialStatus.WAITING, attempt=1))  # retried: no longer a failure
    assert [f["trialId"] for f in model.overview("exp1")["failures"]] == ["t3"]
