"""The experiments' queues and slots (services/dispatcher/slots.py), in memory: which trials hold
a slot, which wait, in which order, whatever the order of submits, ends and retries. No I/O:
only the cache side of :class:`Slots` is driven (taking, freeing, queueing again)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.experiment import ExperimentConfig
from contracts.state import ExperimentState, ExperimentStatus, TrialState, TrialStatus
from services.dispatcher.settings import DispatcherSettings
from services.dispatcher.slots import Slots, TrialQueue
from services.dispatcher.store import StateStore

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
EXP = "e1"
#: The adapter a ``local`` experiment's trials go to.
ADAPTER = "local-gpu"


def experiment(concurrency: int) -> ExperimentState:
    config = ExperimentConfig.model_validate(
        {"trialCommand": "true", "trialConcurrency": concurrency, "trainingService": {"platform": "local"}}
    )
    return ExperimentState(id=EXP, config=config, code_ref="", start_time=NOW)


def new_slots(concurrency: int, trials: int) -> tuple[Slots, StateStore]:
    """An experiment with ``trials`` submitted, none dispatched yet."""
    store = StateStore()
    store.experiments[EXP] = experiment(concurrency)
    settings = DispatcherSettings(trial_secret="s", api_auth="none")
    slots = Slots(settings, bus=None, store=store)  # the cache side needs no bus
    for n in range(trials):
        trial = TrialState(id=f"t{n}", experiment_id=EXP, sequence_id=n, platform=ADAPTER, submit_time=NOW)
        store.defer(trial)
        slots.enqueue(trial)
    return slots, store


def where(slots: Slots, trial_id: str) -> list[str]:
    """The tables that hold the trial: exactly one while it has not ended, none after."""
    held = [
        ("queue", trial_id in slots.queue[EXP]),
        ("later", trial_id in slots.later[EXP]),
        ("active", trial_id in slots.active[EXP]),
    ]
    return [name for name, there in held if there]


def test_a_queue_keeps_submission_order_and_takes_any_trial_out():
    queue = TrialQueue()
    for trial_id in "abcd":
        queue.append(trial_id)
    queue.remove("b")
    queue.appendleft("z")
    assert list(queue) == ["z", "a", "c", "d"] and len(queue) == 4 and "b" not in queue
    assert (queue.popleft(), queue.first()) == ("z", "a")


def test_free_slots_take_the_oldest_trials_and_an_end_lets_the_next_one_in():
    slots, store = new_slots(concurrency=2, trials=4)

    taken = slots.take_ready(EXP)

    assert [t.id for t in taken] == ["t0", "t1"]
    assert all(store.trials[t].dispatched and store.trials[t].platform == ADAPTER for t in ("t0", "t1"))
    assert slots.take_ready(EXP) == []  # no free slot: t2 and t3 wait
    slots.free(store.trials["t0"].model_copy(update={"status": TrialStatus.SUCCEEDED}))
    assert [t.id for t in slots.take_ready(EXP)] == ["t2"]
    assert (sorted(slots.active[EXP]), list(slots.queue[EXP])) == (["t1", "t2"], ["t3"])


def test_a_retry_waits_out_its_back_off_then_goes_first():
    slots, store = new_slots(concurrency=1, trials=2)
    [first] = slots.take_ready(EXP)
    retry = first.model_copy(update={"dispatched": False, "attempt": 1, "retry_at": NOW + timedelta(seconds=5)})

    slots.free(first)
    slots.again(retry)
    store.defer(retry)

    assert where(slots, "t0") == ["later"]
    slots.due(EXP, NOW)  # not yet
    assert [t.id for t in slots.take_ready(EXP)] == ["t1"]  # meanwhile the next trial runs
    slots.free(store.trials["t1"].model_copy(update={"status": TrialStatus.FAILED}))
    slots.due(EXP, NOW + timedelta(seconds=5))
    assert where(slots, "t0") == ["queue"] and [t.id for t in slots.take_ready(EXP)] == ["t0"]


def test_a_stopped_experiment_dispatches_nothing():
    slots, store = new_slots(concurrency=3, trials=2)
    store.experiments[EXP] = store.experiments[EXP].model_copy(update={"status": ExperimentStatus.STOPPED})
    assert slots.take_ready(EXP) == [] and list(slots.queue[EXP]) == ["t0", "t1"]


def test_a_deleted_experiment_leaves_nothing_held():
    slots, store = new_slots(concurrency=1, trials=3)
    slots.take_ready(EXP)
    slots.forget(EXP, [store.trials[t].model_copy(update={"status": TrialStatus.USER_CANCELED}) for t in store.trials])
    assert (EXP in slots.queue, EXP in slots.active, EXP in slots.later, slots.unsent) == (False, False, False, set())
    assert slots.placement.sent[ADAPTER] == 0


#: A step of the property below: (what, which trial).
STEPS = st.lists(st.tuples(st.sampled_from(["take", "end", "retry", "due"]), st.integers(0, 5)), max_size=40)


@settings(max_examples=100, deadline=None)
@given(concurrency=st.integers(1, 3), steps=STEPS)
def test_in_any_order_of_ends_and_retries_each_trial_is_held_once_and_slots_never_overflow(concurrency, steps):
    slots, store = new_slots(concurrency, trials=6)
    now = NOW
    for what, n in steps:
        trial = store.trials[f"t{n}"]
        if what == "take":
            slots.take_ready(EXP)
        elif what == "due":
            now += timedelta(seconds=10)
            slots.due(EXP, now)
        elif not trial.status.terminal and what == "end":
            ended = trial.model_copy(update={"status": TrialStatus.SUCCEEDED})
            slots.free(ended)
            store.defer(ended)
        elif not trial.status.terminal and what == "retry" and trial.dispatched:
            again = trial.model_copy(
                update={
                    "dispatched": False,
                    "attempt": trial.attempt + 1,
                    "platform": ADAPTER,
                    "retry_at": now + timedelta(seconds=5 * (n % 2)),
                }
            )
            slots.free(trial)
            slots.again(again)
            store.defer(again)

        assert len(slots.active[EXP]) <= concurrency
        assert slots.placement.sent[ADAPTER] == len(slots.active[EXP])
        for trial_id, trial in store.trials.items():
            expected = [[]] if trial.status.terminal else [["active"]] if trial.dispatched else [["queue"], ["later"]]
            assert where(slots, trial_id) in expected


def test_a_hybrid_trial_refused_by_the_teams_shares_on_one_platform_goes_to_another_with_room():
    from contracts import GpuStatus, MachineStatus, PlatformStatus
    from contracts.base import utcnow
    from contracts.teams import Quota, Team

    gpus = [GpuStatus(index=i, uuid=f"GPU-{i}", name="H100", memory_total_mib=80, memory_used_mib=0) for i in range(2)]
    remote = {"platform": "remote", "machineList": [{"host": "a", "user": "u"}]}
    store = StateStore()
    hybrid = ExperimentConfig.model_validate(
        {
            "trialCommand": "true",
            "trialConcurrency": 2,
            "trialGpuNumber": 1,
            "trainingService": [{"platform": "local", "useActiveGpu": True}, remote],
        }
    )
    local = ExperimentConfig.model_validate(
        {
            "trialCommand": "true",
            "trialConcurrency": 2,
            "trialGpuNumber": 1,
            "trainingService": {"platform": "local", "useActiveGpu": True},
        }
    )
    store.experiments["vision-e"] = ExperimentState(
        id="vision-e", config=hybrid, code_ref="", start_time=NOW, team="vision"
    )
    store.experiments["nlp-e"] = ExperimentState(id="nlp-e", config=local, code_ref="", start_time=NOW, team="nlp")
    slots = Slots(DispatcherSettings(trial_secret="s", api_auth="none"), bus=None, store=store)
    slots.shares.teams = {"nlp": Team(name="nlp", quota=Quota(gpus=2))}
    now = utcnow()
    for status in (
        PlatformStatus(adapter="local-gpu", replica="r", host="h", time=now, max_trials=8, gpus=gpus),
        PlatformStatus(
            adapter="remote",
            replica="r",
            host="h",
            time=now,
            machines=[MachineStatus(name="u@a:22", up=True, gpus=gpus)],
        ),
    ):
        slots.placement.status(f"{status.adapter}.r", status)
    for n, experiment_id in enumerate(["nlp-e", "nlp-e", "vision-e"]):
        platform = "" if experiment_id == "vision-e" else "local-gpu"  # a hybrid trial's: chosen at dispatch
        trial = TrialState(id=f"t{n}", experiment_id=experiment_id, sequence_id=n, platform=platform, submit_time=NOW)
        store.defer(trial)
        slots.enqueue(trial)
    # Given team nlp, within its quota, ready to take local's two GPUs (its turn comes first there)
    assert slots.turn(store.experiments["nlp-e"], "local-gpu", 0) is None
    # When vision's hybrid experiment looks for a platform: local's shares refuse it, remote has room
    taken = slots.take_ready("vision-e")
    # Then its trial goes to remote, and it waits in no queue of local's
    assert [(t.id, t.platform) for t in taken] == [("t2", "remote")]
    assert "vision-e" not in slots.shares.demands["local-gpu"]
    # and nlp's trials take local's GPUs
    assert [t.platform for t in slots.take_ready("nlp-e")] == ["local-gpu", "local-gpu"]
