"""The contract every platform adapter keeps, as one abstract test class.

Subclass :class:`AdapterContract` in ``tests/contract/test_<platform>_contract.py`` (yours too:
see ``docs/adding-a-platform.md``), implement :meth:`~AdapterContract.make_adapter` (and
:meth:`~AdapterContract.starts` if your platform runs no commands), and every test below runs
against your adapter on a real ``nats-server``. A platform whose trials need its own
``trainingService`` sets :attr:`~AdapterContract.service` and puts it on the bus with
:meth:`~AdapterContract.put_experiment`, as the dispatcher does; class attributes say where
the platform may differ (:attr:`~AdapterContract.notifies_while_running`,
:attr:`~AdapterContract.queues`). The tests call the adapter directly, as :class:`AdapterService`
does, in the order it guarantees: ``start`` → ``adopt`` → launch/poll/cancel/release → ``stop``.

What they prove: a trial runs to its exit code; launching an attempt twice runs it once;
the adapter says when a trial ended (``notify``); cancel ends a running trial quickly;
no capacity is ``None``; a restarted adapter adopts running trials and reports the real
end of those that ended while nobody watched; released trials stay released.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from contracts import (
    ExperimentConfig,
    ExperimentState,
    LocalConfig,
    TrainingService,
    TrialRequest,
    TrialStatus,
    streams,
)
from contracts.base import utcnow
from services.adapters.base import PlatformAdapter, TrialHandle
from services.common.bus import Bus, bootstrap, connect
from services.common.settings import ServiceSettings
from tests.contract.harness import Harness, outcome_at_a_notify

_ids = itertools.count()

#: The experiment of every trial the contract runs.
EXPERIMENT = "contract"
#: The adapters' metrics gateway, where none listens: trials here report no metrics.
NO_GATEWAY = "http://127.0.0.1:9"


class AdapterContract:
    """Subclass me. ``make_adapter`` is all a platform has to provide; ``starts`` too if its
    trials run no command."""

    #: The most trials the adapter from :meth:`make_adapter` runs at once.
    capacity: ClassVar[int] = 2
    #: Seconds from ``cancel`` to the end being reported by ``poll``.
    cancel_within: ClassVar[float] = 2.0
    #: Seconds a trial of ``duration`` 0 may take to start and end on this platform.
    slack: ClassVar[float] = 5.0
    #: Whether the adapter also calls ``notify`` while a trial runs (at a state change, a
    #: reconnect), not only at its end: then how the trial ended is checked at one of the calls
    #: naming it (:func:`outcome_at_a_notify`), not at the first call.
    notifies_while_running: ClassVar[bool] = False
    #: Whether the platform queues the trials it has no room for: then the adapter hands every
    #: trial over and never answers None, and more than :attr:`capacity` trials all start.
    queues: ClassVar[bool] = False
    #: The trials' ``trainingService`` (None: ``platform: local``). A platform's fixture sets
    #: its own, and puts it on the bus with :meth:`put_experiment`.
    service: TrainingService | None = None

    def make_adapter(self, workspace: Path) -> PlatformAdapter:
        """A new adapter for the platform state kept in ``workspace``, with room for
        :attr:`capacity` trials. Called again with the same workspace to play a restart."""
        raise NotImplementedError

    def starts(self, workspace: Path, trial_id: str) -> int:
        """How many times the platform really started the trial (all attempts together): by
        default, the lines the trial's command appended to its start marker (:meth:`request`)."""
        marker = workspace / "starts" / trial_id
        return len(marker.read_text().splitlines()) if marker.exists() else 0

    def request(self, workspace: Path, duration: float = 0.0, exit_code: int = 0, attempt: int = 0) -> TrialRequest:
        """A trial that runs ``duration`` seconds, then exits with ``exit_code``. The command
        appends a line to ``<workspace>/starts/<trial>`` when it starts; parameters carry
        ``duration`` and ``exitCode`` for platforms that do not run commands."""
        trial = f"t{next(_ids)}x{time.monotonic_ns() % 10**6}"
        command = f'echo started >> "{workspace}/starts/{trial}"; sleep {duration}; exit {exit_code}'
        parameters = {"duration": duration, "exitCode": exit_code}
        record = {"parameter_id": 0, "parameter_source": "algorithm", "parameters": parameters}
        return TrialRequest(
            experiment_id=EXPERIMENT,
            trial_id=trial,
            sequence_id=0,
            attempt=attempt,
            trial_command=command,
            parameter_record=json.dumps(record),
            training_service=self.training_service(command),
            token="not-a-secret",
        )

    def training_service(self, command: str) -> TrainingService:
        """The ``trainingService`` of a trial that runs ``command``: :attr:`service`. Override it
        where the platform takes the command from there."""
        return LocalConfig() if self.service is None else self.service

    async def put_experiment(self, bus: Bus, **fields: Any) -> None:
        """The experiment on the bus, where a restarted adapter finds its platform again, as the
        dispatcher puts it there: :attr:`capacity` trials at once on :attr:`service`, with
        ``fields`` (NNI's names) besides."""
        config = ExperimentConfig.model_validate(
            {"trialCommand": "true", "trialConcurrency": self.capacity, **fields, "trainingService": self.service}
        )
        experiments = await bus.kv(streams.EXPERIMENTS_BUCKET.bucket)
        await experiments.put(EXPERIMENT, ExperimentState(id=EXPERIMENT, config=config, start_time=utcnow()).encode())

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture
    def workspace(self, tmp_path: Path) -> Path:
        (tmp_path / "starts").mkdir()
        return tmp_path

    @pytest.fixture
    async def bus(self, nats_server) -> Bus:
        bus = await connect(ServiceSettings(nats_url=nats_server.url, stop_timeout=2), "contract-test")
        await bootstrap(bus.js)
        yield bus
        await bus.close()

    @pytest.fixture
    async def platform(self, workspace: Path, bus: Bus):
        harness = Harness(
            bus,
            make_adapter=functools.partial(self.make_adapter, workspace),
            starts=functools.partial(self.starts, workspace),
            request=functools.partial(self.request, workspace),
            slack=self.slack,
        )
        yield harness
        await harness.close()

    # ------------------------------------------------------------------ the contract

    async def test_a_trial_runs_to_its_exit_code(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        ok = await adapter.launch(platform.request(exit_code=0))
        bad = await adapter.launch(platform.request(exit_code=3))

        succeeded, failed = await platform.outcome(ok), await platform.outcome(bad)

        assert (succeeded.status, succeeded.exit_code) == (TrialStatus.SUCCEEDED, 0), succeeded
        assert (failed.status, failed.exit_code) == (TrialStatus.FAILED, 3), failed
        assert "3" in failed.message, failed

    async def test_launching_an_attempt_twice_runs_it_once(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        request = platform.request(duration=0.3)

        first, second = await asyncio.gather(adapter.launch(request), adapter.launch(request))
        await platform.outcome(first)
        after_end = await adapter.launch(request)

        assert first == second == after_end
        assert platform.starts(request) == 1
        retry = await adapter.launch(request.model_copy(update={"attempt": 1}))
        assert retry != first and (retry.trial_id, retry.attempt) == (request.trial_id, 1)
        await platform.outcome(retry)
        assert platform.starts(request) == 2

    async def test_the_adapter_says_when_a_trial_ended(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        named: list[TrialHandle | None] = []
        adapter.listen(named.append)

        handle = await adapter.launch(platform.request(duration=0.2))

        if self.notifies_while_running:
            # at one of the trial's namings (not ``poll_interval`` later) ``poll`` says how it ended
            outcome = await outcome_at_a_notify(adapter, handle, named, 0.2 + self.slack)
            assert outcome.status is TrialStatus.SUCCEEDED, outcome
            return
        deadline = time.monotonic() + 0.2 + self.slack
        while handle not in named and None not in named:
            assert time.monotonic() < deadline, "the adapter never called notify() for the ended trial"
            await asyncio.sleep(0.01)
        assert await adapter.poll(handle) is not None

    async def test_cancel_ends_a_running_trial(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        handle = await adapter.launch(platform.request(duration=60))
        await platform.until_started(handle)
        assert await adapter.poll(handle) is None

        began = time.monotonic()
        await adapter.cancel(handle)
        outcome = await platform.outcome(handle, timeout=self.cancel_within)

        assert time.monotonic() - began <= self.cancel_within
        assert outcome.status.terminal and outcome.status is not TrialStatus.SUCCEEDED
        await adapter.cancel(handle)  # canceling an ended trial is not an error

    async def test_no_capacity_is_none_until_a_trial_ends(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        if self.queues:  # each trial its own job, all taken, all started
            queued = [await adapter.launch(platform.request(duration=60)) for _ in range(self.capacity + 1)]
            assert all(queued) and len(set(queued)) == len(queued)
            for handle in queued:
                await platform.until_started(handle)
                assert await adapter.poll(handle) is None
            return
        running = [await adapter.launch(platform.request(duration=60)) for _ in range(self.capacity)]
        assert all(running)

        assert await adapter.launch(platform.request()) is None

        await adapter.cancel(running[0])
        await platform.outcome(running[0], timeout=self.cancel_within)
        assert await adapter.launch(platform.request()) is not None

    async def test_a_restarted_adapter_adopts_running_trials(self, platform: Harness) -> None:
        first = await platform.adapter()
        request = platform.request(duration=60)
        handle = await first.launch(request)
        await platform.until_started(handle)
        await platform.stop(first)

        second = await platform.adapter()
        adopted = await second.adopt()

        assert handle in adopted
        assert await second.poll(handle) is None
        assert await second.launch(request) == handle
        await second.cancel(handle)
        assert (await platform.outcome(handle, timeout=self.cancel_within)).status.terminal
        assert platform.starts(request) == 1

    async def test_the_real_end_of_a_lost_trial_is_reported(self, platform: Harness) -> None:
        first = await platform.adapter()
        handle = await first.launch(platform.request(duration=0.3, exit_code=3))
        await platform.stop(first)  # nobody watches while it ends
        await asyncio.sleep(0.3 + 0.5)

        second = await platform.adapter()
        adopted = await second.adopt()

        assert handle in adopted
        outcome = await platform.outcome(handle, adapter=second)
        assert (outcome.status, outcome.exit_code) == (TrialStatus.FAILED, 3)

    async def test_released_trials_are_not_adopted_again(self, platform: Harness) -> None:
        first = await platform.adapter()
        handle = await first.launch(platform.request())
        await platform.outcome(handle)
        await first.release(handle)
        await platform.stop(first)

        second = await platform.adapter()

        assert handle not in await second.adopt()

    async def test_the_log_tail_is_text(self, platform: Harness) -> None:
        adapter = await platform.adapter()
        handle = await adapter.launch(platform.request())
        await platform.outcome(handle)

        assert isinstance(await adapter.log_tail(handle, 4096), str)
