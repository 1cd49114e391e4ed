"""The dispatcher's state store against a real nats-server: deferred writes (group commit)
and what happens to them when KV refuses a write."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.errors import NoKeysError

from contracts.base import utcnow
from contracts.state import TrialState, TrialStatus
from contracts.streams import TRIALS_BUCKET
from services.common.bus import Bus, bootstrap
from services.dispatcher.store import StateStore
from tests.fixtures.nats import NatsServer


@pytest.fixture
async def bus(nats_server: NatsServer):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await bootstrap(js)
    yield Bus(nc, js)
    await nc.drain()


@pytest.fixture
async def store(bus: Bus) -> StateStore:
    store = StateStore()
    await store.load(bus)
    return store


def trial(**changes) -> TrialState:
    base = TrialState(id="Tstore1", experiment_id="exp1", sequence_id=0, platform="local", submit_time=utcnow())
    return base.model_copy(update=changes)


async def stored(bus: Bus, trial_id: str) -> tuple[TrialState, int]:
    """The trial as KV holds it, and how many writes the key has seen."""
    kv = await bus.kv(TRIALS_BUCKET.bucket)
    for _ in range(50):  # nats-py's history() can end before its first value arrives (services/common/kvwatch.py)
        try:
            history = await kv.history(trial_id)
            break
        except NoKeysError:  # the writes were acknowledged: the keys are there, ask again
            await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"no history of {trial_id} after 50 reads")
    return TrialState.decode(history[-1].value), len(history)


async def test_deferred_states_of_a_trial_are_written_once_with_the_newest(bus: Bus, store: StateStore) -> None:
    store.defer(trial(status=TrialStatus.RUNNING))
    store.defer(trial(status=TrialStatus.SUCCEEDED, final_metric=0.5))

    assert store.trials["Tstore1"].status == TrialStatus.SUCCEEDED  # readers see it at once
    await store.flush(["Tstore1", "Tstore1"])

    state, writes = await stored(bus, "Tstore1")
    assert (state.status, state.final_metric, writes) == (TrialStatus.SUCCEEDED, 0.5, 1)
    assert store.dirty == {}
    await store.flush(["Tstore1"])  # nothing deferred: nothing written
    assert (await stored(bus, "Tstore1"))[1] == 1


async def test_a_failed_flush_keeps_the_trial_dirty_until_a_later_flush_writes_it(bus: Bus, store: StateStore) -> None:
    await store.put_trial(trial(status=TrialStatus.RUNNING))
    await bus.js.delete_key_value(TRIALS_BUCKET.bucket)  # KV refuses writes now

    store.defer(trial(status=TrialStatus.FAILED, exit_code=3))
    with pytest.raises(Exception):  # noqa: B017 - whatever nats-py raises for "no stream"
        await store.flush(["Tstore1"])
    assert "Tstore1" in store.dirty and store.trials["Tstore1"].status == TrialStatus.FAILED

    await bus.js.create_key_value(TRIALS_BUCKET)
    await store.flush(list(store.dirty))  # what the sweep does
    state, _ = await stored(bus, "Tstore1")
    assert (state.status, state.exit_code) == (TrialStatus.FAILED, 3)
    assert store.dirty == {}


async def test_a_write_through_supersedes_what_was_deferred(bus: Bus, store: StateStore) -> None:
    store.defer(trial(status=TrialStatus.RUNNING, intermediate_count=4))
    await store.put_trial(trial(status=TrialStatus.USER_CANCELED, intermediate_count=4))

    assert store.dirty == {}
    await store.flush(["Tstore1"])
    state, writes = await stored(bus, "Tstore1")
    assert (state.status, writes) == (TrialStatus.USER_CANCELED, 1)
