"""One attempt on OpenPAI, as the openpai adapter keeps it: the :class:`Job` record (the job,
or in reuse mode the environment, that runs the attempt; its folder on the share; what was
last read of its state), the :class:`Jobs` this replica tracks, and the count of a trial
job's tasks.

Shared by every part of :class:`~services.adapters.openpai.adapter.OpenpaiAdapter`; nothing
here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from contracts.experiment import OpenpaiConfig
from contracts.retries import Failure
from services.adapters import sharefs
from services.adapters.base import TrialHandle, TrialOutcome, find_attempt
from services.adapters.openpai.client import OpenpaiClient
from services.adapters.openpai.reuse import Environment, Key


@dataclass(eq=False)
class Job:
    """One attempt: the OpenPAI job (or reuse-mode environment) that runs it, and its outcome once known."""

    handle: TrialHandle
    client: OpenpaiClient
    name: str
    share: sharefs.Share
    report: str  # the reporting task role
    state: str = "WAITING"  # jobStatus.state as last read
    outcome: TrialOutcome | None = None
    detail: dict = field(default_factory=dict)
    env: Environment | None = None  # reuse mode: the environment running it
    tasks: int = 1  # tasks of the job (or environment): more than one stop together in reuse mode
    seen: float = 0.0  # reuse mode: mtime of the reporting task's state.json when last read
    since: float = field(default_factory=time.monotonic)  # when ``state`` last changed
    #: OpenPAI's own retries of the job after platform failures, as last seen before the trial started.
    platform_retries: int = 0
    #: Why the attempt ended, once OpenPAI retried the job by itself and the adapter stopped it,
    #: and the failure class of the platform attempt that failed (its exit spec).
    taken_back: str | None = None
    taken_failure: Failure = "infrastructure"


class Jobs:
    """The attempts this replica tracks, by ``(trial id, attempt)``: launched or adopted, until released."""

    def __init__(self) -> None:
        self._by_key: dict[Key, Job] = {}

    def get(self, key: Key) -> Job | None:
        return self._by_key.get(key)

    def find(self, handle: TrialHandle) -> Job:
        """The attempt's job; PermanentError when this replica does not track it."""
        return find_attempt(self._by_key, handle)

    def add(self, job: Job) -> Job:
        self._by_key[(job.handle.trial_id, job.handle.attempt)] = job
        return job

    def pop(self, key: Key) -> Job | None:
        return self._by_key.pop(key, None)

    def __iter__(self) -> Iterator[Job]:
        """A snapshot: the loops await while iterating, and attempts come and go meanwhile."""
        return iter(list(self._by_key.values()))


def task_count(service: OpenpaiConfig) -> int:
    """The tasks of a trial's job: the instances of every task role."""
    roles = (service.openpai_config or {}).get("taskRoles") or {"taskrole": {}}
    return sum(int(spec.get("instances", 1)) if isinstance(spec, dict) else 1 for spec in roles.values())
