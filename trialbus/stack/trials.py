"""What a user's stop does to running trials: it ends them, as ``nnictl stop`` does.

A stop of ``trialbus up`` (Ctrl-C, SIGTERM, ``trialbus down``) stops every RUNNING experiment
through the dispatcher's API, with the reason, so each running trial ends USER_CANCELED with
"the experiment was stopped: …" as its message and no GPU stays held by a trial nobody
watches. ``--keep-trials`` skips this: trials run on, and the next ``up`` adopts them. A
supervisor's restart of one service never comes here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from contracts import ExperimentStatus
from trialbus.client import AsyncClient, TrialbusError


@dataclass
class TrialStop:
    """What :func:`end_running_trials` did."""

    #: Experiment id → its trials that were WAITING or RUNNING when it was stopped.
    stopped: dict[str, int] = field(default_factory=dict)
    #: Trials not yet ended when the deadline came (their adapters end them, or adopt them later).
    still_running: int = 0
    #: Why the dispatcher could not be asked, if it could not.
    error: str | None = None


def end_running_trials(
    nats_url: str, auth: tuple[str, str], reason: str, deadline: float, hurried: Callable[[], bool]
) -> TrialStop:
    """Stop every RUNNING experiment with ``reason`` and wait until their trials have ended,
    until ``deadline`` (monotonic) or until ``hurried()``. Never raises: a dispatcher that does
    not answer is reported in :attr:`TrialStop.error`."""
    result = TrialStop()

    async def main() -> None:
        work = asyncio.create_task(_stop(nats_url, auth, reason, deadline, result))
        while not work.done():
            if hurried() or time.monotonic() >= deadline:
                work.cancel()
                break
            await asyncio.wait([work], timeout=0.1)
        try:
            await work
        except asyncio.CancelledError:
            pass
        except (TrialbusError, OSError, TimeoutError) as exc:
            result.error = str(exc)

    asyncio.run(main())
    return result


async def _stop(nats_url: str, auth: tuple[str, str], reason: str, deadline: float, result: TrialStop) -> None:
    timeout = max(0.5, min(5.0, deadline - time.monotonic()))
    user, password = auth
    async with AsyncClient(nats_url, user=user, password=password, request_timeout=timeout) as client:
        for experiment in await client.list_experiments():  # O(experiments): one call, counts included
            if experiment.status == ExperimentStatus.RUNNING:
                live = experiment.trial_counts.get("WAITING", 0) + experiment.trial_counts.get("RUNNING", 0)
                await client.stop_experiment(experiment.id, reason)
                result.stopped[experiment.id] = live
        result.still_running = sum(result.stopped.values())
        while result.still_running:
            left = 0
            for experiment_id in result.stopped:  # O(stopped experiments) per check
                counts = (await client.get_experiment(experiment_id)).trial_counts
                left += counts.get("WAITING", 0) + counts.get("RUNNING", 0)
            result.still_running = left
            if left == 0:
                return
            await asyncio.sleep(0.2)
