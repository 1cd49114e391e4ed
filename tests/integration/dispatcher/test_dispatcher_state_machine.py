"""The trial state machine (services/dispatcher: inputs, attempts, ends, slots), driven with
every order of what adapters and users do: events of the current attempt, late ones of an
older attempt, duplicates, events from a second copy or another adapter, a user's cancel and
retry, the sweep. Whatever the order, each trial is in exactly one legal state, an ended
attempt never changes its end, the slots never overflow, and KV holds what the API answers.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from contracts.state import TrialState, TrialStatus
from contracts.streams import TRIALS_BUCKET
from services.common.api import ApiError
from tests.fixtures.nats import NatsServer
from tests.integration.dispatcher.harness import Driver, connect, dispatcher

TRIALS = 3
CONCURRENCY = 2

#: What the adapter may say of a trial's current attempt, and with which failure class.
SAYS = [
    (TrialStatus.RUNNING, None),
    (TrialStatus.SUCCEEDED, None),
    (TrialStatus.FAILED, "trial"),
    (TrialStatus.FAILED, "infrastructure"),  # retried once (the policy below)
    (TrialStatus.FAILED, "preempted"),  # retried, counted against no budget
    (TrialStatus.SYS_CANCELED, None),
    (TrialStatus.EARLY_STOPPED, None),
]
STEP = st.one_of(
    st.tuples(st.just("say"), st.integers(0, TRIALS - 1), st.sampled_from(SAYS)),
    st.tuples(st.just("stale"), st.integers(0, TRIALS - 1), st.sampled_from(SAYS)),  # an older attempt's
    st.tuples(st.just("copy"), st.integers(0, TRIALS - 1), st.sampled_from(SAYS)),  # another replica's
    st.tuples(st.just("foreign"), st.integers(0, TRIALS - 1), st.sampled_from(SAYS)),  # another adapter's
    st.tuples(st.just("cancel"), st.integers(0, TRIALS - 1), st.none()),
    st.tuples(st.just("retry"), st.integers(0, TRIALS - 1), st.none()),
    st.tuples(st.just("sweep"), st.just(0), st.none()),
)


def seen(trial: TrialState) -> tuple:
    """What a user sees of a trial."""
    return trial.status, trial.attempt, trial.start_time, trial.end_time, trial.exit_code


async def run(url: str, steps: list) -> None:
    bus = await connect(url)
    try:
        core = await dispatcher(bus)
        run = await Driver.start(core, CONCURRENCY, retry={"infrastructure": 1, "trial": 0, "backoff": 0})
        trials = await run.submit(TRIALS)
        ended: dict[str, tuple[int, TrialStatus, object]] = {}  # trial → (attempt, status, end time) once ended
        for what, n, said in steps:
            trial_id = trials[n]
            trial = run.trial(trial_id)
            note(f"{what} {n} {said}: {seen(trial)} {trial.replica}")
            if what == "say" and trial.dispatched:  # an adapter speaks only of trials sent to it
                await run.say(trial_id, said[0], failure=said[1])
            elif what == "stale" and trial.attempt > 0:
                await run.say(trial_id, said[0], failure=said[1], attempt=trial.attempt - 1)
                assert seen(run.trial(trial_id)) == seen(trial)  # an attempt that is over changes nothing
            elif what == "copy" and trial.replica:  # a replica other than the one that started the attempt
                await run.say(trial_id, said[0], failure=said[1], replica=f"not-{trial.replica}")
                assert seen(run.trial(trial_id)) == seen(trial)  # a second copy is fenced off
            elif what == "foreign":
                await run.say(trial_id, said[0], failure=said[1], source="remote")
                assert seen(run.trial(trial_id)) == seen(trial)  # only the trial's own adapter is heard
            elif what == "cancel":
                try:
                    await core.cancel_trial(trial_id)
                except ApiError as exc:  # what the user is told
                    assert (exc.status, trial.status.terminal) == (409, True)
            elif what == "retry":
                try:
                    retried = await core.retry_trial(trial_id)
                except ApiError as exc:
                    assert (exc.status, trial.status.terminal) == (409, False)
                else:
                    assert (retried.status, retried.attempt) == (TrialStatus.WAITING, trial.attempt + 1)
                    ended.pop(trial_id)
            elif what == "sweep":
                await core.sweep()

            queue, later, active = (
                table[run.experiment_id] for table in (core.slots.queue, core.slots.later, core.slots.active)
            )
            assert len(active) <= CONCURRENCY
            assert run.counts().get("RUNNING", 0) <= CONCURRENCY  # never more RUNNING than trialConcurrency
            assert sum(run.counts().values()) == TRIALS
            for trial_id in trials:
                trial = run.trial(trial_id)
                held = [trial_id in queue, trial_id in later, trial_id in active]
                assert sum(held) == (0 if trial.status.terminal else 1), (trial_id, trial.status, held)
                if trial.status == TrialStatus.RUNNING:
                    assert trial_id in active
                if trial_id in ended:  # an end is final: only a user's retry starts the trial over
                    assert (trial.attempt, trial.status, trial.end_time) == ended[trial_id]
                elif trial.status.terminal:
                    ended[trial_id] = (trial.attempt, trial.status, trial.end_time)
        await core.store.flush(list(core.store.dirty))  # what the group commit writes a moment later
        kv = await bus.kv(TRIALS_BUCKET.bucket)
        for trial_id in trials:
            stored = run.trial(trial_id).decode((await kv.get(trial_id)).value)
            assert (stored.status, stored.attempt) == (run.status(trial_id), run.trial(trial_id).attempt)
    finally:
        await bus.nc.drain()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, min_size=1, max_size=30))
def test_every_order_of_events_and_user_actions_leaves_each_trial_in_one_legal_state(server: NatsServer, steps):
    asyncio.run(run(server.url, steps))
