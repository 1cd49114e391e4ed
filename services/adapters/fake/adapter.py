"""An in-memory platform and its adapter: the worked example of a :class:`PlatformAdapter`.

A trial "runs" for ``duration`` seconds and "exits" with ``exitCode``, both read from its
parameters (``{"duration": 0.1, "exitCode": 3}``; defaults 0 and 0); a failed one's last stderr
line is its ``stderr`` parameter, if any. :class:`FakePlatform`
plays the compute platform: it outlives any one adapter, so a restart can be tested by
making a second :class:`FakeAdapter` on the same platform. It reports no metrics.

Every call costs O(1) (``running`` O(capacity)): ``python -m services.adapters.fake`` runs it
as a service, standing in for a platform that runs no process, so that benchmarks
(``make bench-scale``) push 100,000 trials through the rest of the stack.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace

from contracts import TrialRequest
from services.adapters.base import PlatformAdapter, TrialHandle, TrialOutcome


@dataclass
class FakeRun:
    handle: TrialHandle
    ends_at: float  # monotonic seconds
    exit_code: int
    stderr: str | None = None
    canceled: bool = False
    reported: bool = False


@dataclass
class FakePlatform:
    """The "cluster": runs by ``<trial>:<attempt>``; ``starts`` counts how often each really started."""

    capacity: int = 8
    runs: dict[str, FakeRun] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    #: The runs that may still be running (at most ``capacity``): ``running`` looks at these only.
    live: dict[str, FakeRun] = field(default_factory=dict)

    def running(self) -> int:
        now = time.monotonic()
        for key in [k for k, run in self.live.items() if run.canceled or run.ends_at <= now]:
            del self.live[key]
        return len(self.live)


class FakeAdapter(PlatformAdapter):
    name = "fake"

    def __init__(self, platform: FakePlatform | None = None, name: str | None = None, forget: bool = False) -> None:
        self.platform = platform or FakePlatform()
        if name is not None:  # stands in for another platform (its dispatch subject and events)
            # The one adapter whose name is per instance: PlatformAdapter declares it a ClassVar (base.py,
            # not in this change) for the platforms, each one class; a plain ``name: str`` there ends this ignore.
            self.name = name  # type: ignore[misc]
        self.forget = forget

    async def launch(self, request: TrialRequest) -> TrialHandle | None:
        key = f"{request.trial_id}:{request.attempt}"
        if (run := self.platform.runs.get(key)) is not None:  # idempotent: the same attempt, not a new run
            return run.handle
        if self.platform.running() >= self.platform.capacity:
            return None  # no capacity now: the service offers the request again later
        record = json.loads(request.parameter_record)
        parameters = record.get("parameters", record)
        duration = float(parameters.get("duration", 0.0))
        handle = TrialHandle(request.experiment_id, request.trial_id, request.attempt, ref=key)
        stderr = parameters.get("stderr")
        run = FakeRun(
            handle,
            time.monotonic() + duration,
            int(parameters.get("exitCode", 0)),
            stderr if isinstance(stderr, str) else None,
        )
        self.platform.runs[key] = self.platform.live[key] = run
        self.platform.starts[request.trial_id] = self.platform.starts.get(request.trial_id, 0) + 1
        asyncio.get_running_loop().call_later(duration, self.notify, handle)  # the platform's "it exited" callback
        return handle

    async def poll(self, handle: TrialHandle) -> TrialOutcome | None:
        run = self.platform.runs[handle.ref]
        if run.canceled:
            return TrialOutcome.exited(-15)
        if time.monotonic() < run.ends_at:
            return None
        outcome = TrialOutcome.exited(run.exit_code)
        return replace(outcome, last_error=run.stderr) if run.exit_code else outcome

    async def cancel(self, handle: TrialHandle) -> None:
        run = self.platform.runs[handle.ref]
        if time.monotonic() < run.ends_at:
            run.canceled = True
            self.notify(handle)

    async def adopt(self) -> list[TrialHandle]:
        return [run.handle for run in self.platform.runs.values() if not run.reported]

    async def release(self, handle: TrialHandle) -> None:
        self.platform.runs[handle.ref].reported = True
        if self.forget:  # a long-running service keeps no record of reported runs
            self.platform.runs.pop(handle.ref, None)

    async def log_tail(self, handle: TrialHandle, max_bytes: int) -> str:
        return f"[fake] trial {handle.trial_id} attempt {handle.attempt}\n"[-max_bytes:]
