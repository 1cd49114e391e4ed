"""A dispatcher driven by the test instead of its service: its state machine over a real
nats-server (its KV and streams), the test playing the adapters and the users.

Nothing of ours is replaced: the test says what an adapter would say (an event on the
adapter's own subject, as :mod:`services.adapters` publish them) and what a user would do
(the API's calls), and reads what a user would see (a trial's status, an experiment's counts).
"""

from __future__ import annotations

import secrets
from typing import Any

import nats

from contracts import subjects
from contracts.base import utcnow
from contracts.experiment import ExperimentConfig
from contracts.messages import TrialEvent
from contracts.state import ExperimentState, TrialState, TrialStatus
from services.common.bus import Bus, bootstrap
from services.dispatcher.core import Dispatcher
from services.dispatcher.settings import DispatcherSettings
from services.dispatcher.store import StateStore

#: The adapter a ``local`` experiment's trials go to, and the replica that runs them.
ADAPTER, REPLICA = "local-gpu", "host-a"


async def connect(url: str) -> Bus:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await bootstrap(js)
    return Bus(nc, js)


async def dispatcher(bus: Bus) -> Dispatcher:
    """A dispatcher as its service starts one: its state loaded from KV, its queues rebuilt."""
    store = StateStore()
    await store.load(bus)
    settings = DispatcherSettings(trial_secret="test-secret", api_auth="none", control_timeout=0.2)
    core = Dispatcher(settings, bus, store)
    core.rebuild()
    return core


class Driver:
    """One experiment of a dispatcher, driven as its adapter and its users would."""

    def __init__(self, core: Dispatcher, experiment_id: str) -> None:
        self.core = core
        self.experiment_id = experiment_id

    @classmethod
    async def start(cls, core: Dispatcher, concurrency: int = 1, **config: Any) -> Driver:
        """A new RUNNING experiment (as ``create_experiment`` stores it, without asking a platform)."""
        config = ExperimentConfig.model_validate(
            {
                "trialCommand": "python3 t.py",
                "trialConcurrency": concurrency,
                "trainingService": {"platform": "local"},
                **config,
            }
        )
        state = ExperimentState(id=secrets.token_hex(4), config=config, code_ref="", start_time=utcnow())
        await core.store.put_experiment(state)
        return cls(core, state.id)

    async def submit(self, n: int = 1, **parameters: Any) -> list[str]:
        return [(await self.core.submit_trial(self.experiment_id, {"x": i, **parameters})).id for i in range(n)]

    def trial(self, trial_id: str) -> TrialState:
        return self.core.trial(trial_id)

    def status(self, trial_id: str) -> TrialStatus:
        return self.core.trial(trial_id).status

    def experiment(self) -> dict[str, Any]:
        """The experiment as ``GET /experiments/{id}`` shows it."""
        return self.core.experiment_view(self.core.experiment(self.experiment_id))

    def counts(self) -> dict[str, int]:
        return {status: n for status, n in self.experiment()["trialCounts"].items() if n}

    async def say(
        self,
        trial_id: str,
        status: TrialStatus,
        *,
        attempt: int | None = None,
        replica: str = REPLICA,
        source: str = ADAPTER,
        failure: str | None = None,
        exit_code: int | None = None,
        last_error: str | None = None,
    ) -> None:
        """The adapter ``source`` (its replica ``replica``) reports the trial's ``status`` (of its current attempt)."""
        trial = self.core.store.trials[trial_id]
        event = TrialEvent(
            experiment_id=self.experiment_id,
            trial_id=trial_id,
            attempt=trial.attempt if attempt is None else attempt,
            status=status,
            time=utcnow(),
            platform=source,
            replica=replica,
            failure=failure,
            exit_code=exit_code,
            last_error=last_error,
        )
        await self.core.on_events([(subjects.events(self.experiment_id, trial_id, source), event)])
