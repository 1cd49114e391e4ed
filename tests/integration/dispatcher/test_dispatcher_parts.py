"""The dispatcher's smaller parts on their own, each built as the facade builds it: the cancels
asked of the adapters (services/dispatcher/cancels.py) and how an attempt's second copy is told
apart (services/dispatcher/attempts.py)."""

from __future__ import annotations

import asyncio

import pytest

from contracts import subjects
from contracts.base import utcnow
from contracts.messages import CancelRequest, TrialEvent
from contracts.state import TrialState, TrialStatus
from services.dispatcher.attempts import Attempts
from services.dispatcher.cancels import CancelRequests, at_most
from services.dispatcher.core import Dispatcher
from tests.integration.dispatcher.harness import ADAPTER, REPLICA


def trial(**changes) -> TrialState:
    base = TrialState(
        id="t1",
        experiment_id="e1",
        sequence_id=0,
        platform=ADAPTER,
        submit_time=utcnow(),
        status=TrialStatus.RUNNING,
        replica=REPLICA,
        dispatched=True,
    )
    return base.model_copy(update=changes)


def event(status: TrialStatus = TrialStatus.RUNNING, **changes) -> TrialEvent:
    base = TrialEvent(
        experiment_id="e1", trial_id="t1", status=status, time=utcnow(), platform=ADAPTER, replica=REPLICA
    )
    return base.model_copy(update=changes)


@pytest.mark.parametrize(
    ("started", "said", "copy"),
    [
        (trial(), event(replica="host-b"), True),  # another replica runs the same attempt
        (trial(), event(TrialStatus.SUCCEEDED, replica="host-b"), True),
        (trial(), event(), False),  # the replica that started it
        (trial(replica=None), event(replica="host-b"), False),  # not started yet: host-b starts it
        (trial(), event(TrialStatus.WAITING, replica="host-b"), False),  # a wait is no copy running
        (trial(), event(replica="host-b", platform="remote"), False),  # another adapter: the gate's business
    ],
)
def test_a_second_copy_is_another_replica_of_the_same_adapter_running_the_attempt(started, said, copy):
    assert Attempts.another_copy(started, said) is copy


async def test_a_cancel_asks_the_owning_adapter_and_is_remembered_until_forgotten(core: Dispatcher) -> None:
    cancels = CancelRequests(core.bus, timeout=1.0)
    got: list[CancelRequest] = []

    async def replica(msg) -> None:  # the owning replica: answers, and stops the trial
        got.append(CancelRequest.decode(msg.data))
        await msg.respond(b"{}")

    await core.bus.nc.subscribe(subjects.control(ADAPTER, "cancel"), cb=replica)
    assert cancels.sent_at("t1") == 0.0

    await cancels.ask(trial(cancel_status=TrialStatus.EARLY_STOPPED, message="too long"))

    assert [(c.trial_id, c.status, c.message) for c in got] == [("t1", TrialStatus.EARLY_STOPPED, "too long")]
    assert cancels.sent_at("t1") > 0
    cancels.forget("t1")
    assert cancels.sent_at("t1") == 0.0


async def test_a_cancel_nobody_answers_is_only_remembered_for_the_sweep_to_ask_again(core: Dispatcher) -> None:
    cancels = CancelRequests(core.bus, timeout=0.1)
    await cancels.ask(trial(platform="nobody-here"))  # no replica: no error
    assert cancels.sent_at("t1") > 0


async def test_at_most_runs_no_more_than_its_limit_at_once_and_raises_the_first_error() -> None:
    running, most = 0, 0

    async def one(fail: bool) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        if fail:
            raise ValueError("no")

    await at_most(3, (one(False) for _ in range(10)))
    assert most == 3
    with pytest.raises(ValueError):
        await at_most(2, (one(n == 4) for n in range(6)))
