""":class:`Client`: the :class:`~trialbus.client.AsyncClient` API for plain, synchronous Python.

Import it from :mod:`trialbus.client` (or ``trialbus``); it lives here to keep that module small.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from contracts import ExperimentConfig, MetricRecord, PlatformStatus, TrialEvent, TrialState, TrialStatus
from services.common.code import CodeUpload
from trialbus.api import ExperimentUpdate, ExperimentView, SubmittedTrial, TrialMetric, TrialPage
from trialbus.watcher import TrialOutcome

T = TypeVar("T")


class Client:
    """The :class:`~trialbus.client.AsyncClient` API for synchronous code: ``with Client(url) as client: ...``.

    Calls run on an event loop in a daemon thread owned by this object; ``close`` stops it.
    """

    def __init__(self, url: str | None = None, **options: Any) -> None:
        from trialbus.async_client import AsyncClient  # imported when used: loading the client costs

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trialbus-client", daemon=True)
        self._thread.start()
        self._client = AsyncClient(url, **options)

    def _run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    def __enter__(self) -> Client:
        try:
            return self.connect()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, url: str | None = None, **auth: Any) -> Client:
        self._run(self._client.connect(url, **auth))
        return self

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def upload_code(self, directory: str | Path) -> CodeUpload:
        return self._run(self._client.upload_code(directory))

    def create_experiment(self, config: ExperimentConfig | Mapping[str, Any] | str | Path) -> str:
        return self._run(self._client.create_experiment(config))

    def list_experiments(self) -> list[ExperimentView]:
        return self._run(self._client.list_experiments())

    def get_experiment(self, experiment_id: str) -> ExperimentView:
        return self._run(self._client.get_experiment(experiment_id))

    def list_platforms(self) -> list[PlatformStatus]:
        return self._run(self._client.list_platforms())

    def stop_experiment(self, experiment_id: str, message: str | None = None) -> ExperimentView:
        return self._run(self._client.stop_experiment(experiment_id, message))

    def delete_experiment(self, experiment_id: str) -> int:
        return self._run(self._client.delete_experiment(experiment_id))

    def import_results(self, experiment_id: str, data: list[Mapping[str, Any]]) -> ExperimentView:
        return self._run(self._client.import_results(experiment_id, data))

    def resume_experiment(self, experiment_id: str) -> ExperimentView:
        return self._run(self._client.resume_experiment(experiment_id))

    def update_experiment(self, experiment_id: str, **changes: Any) -> ExperimentUpdate:
        return self._run(self._client.update_experiment(experiment_id, **changes))

    def submit_trial(
        self, experiment_id: str, parameters: Mapping[str, Any], parameter_id: int | str | None = None
    ) -> SubmittedTrial:
        return self._run(self._client.submit_trial(experiment_id, parameters, parameter_id))

    def list_trials(
        self, experiment_id: str, *, status: str | list[str] | None = None, sort: str = "sequence"
    ) -> list[TrialState]:
        return self._run(self._client.list_trials(experiment_id, status=status, sort=sort))

    def trial_page(
        self,
        experiment_id: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        status: str | list[str] | None = None,
        sort: str = "sequence",
    ) -> TrialPage:
        return self._run(self._client.trial_page(experiment_id, limit=limit, cursor=cursor, status=status, sort=sort))

    def iter_trials(
        self,
        experiment_id: str,
        *,
        status: str | list[str] | None = None,
        sort: str = "sequence",
        page_size: int | None = None,
    ) -> Iterator[TrialState]:
        """Every trial of the experiment, a page at a time (each page asked for when needed)."""
        cursor = None
        while True:
            page = self.trial_page(experiment_id, limit=page_size, cursor=cursor, status=status, sort=sort)
            yield from page.trials
            if (cursor := page.next_cursor) is None:
                return

    def get_trial(self, trial_id: str) -> TrialState:
        return self._run(self._client.get_trial(trial_id))

    def cancel_trial(self, trial_id: str) -> TrialStatus:
        return self._run(self._client.cancel_trial(trial_id))

    def trial_metrics(self, trial_id: str) -> list[TrialMetric]:
        return self._run(self._client.trial_metrics(trial_id))

    def trial_log(self, trial_id: str, max_bytes: int | None = None, attempt: int | None = None) -> str:
        return self._run(self._client.trial_log(trial_id, max_bytes, attempt))

    def wait_final(self, trial_id: str, timeout: float | None = None, *, experiment_id: str | None = None) -> Any:
        return self._run(self._client.wait_final(trial_id, timeout, experiment_id=experiment_id))

    def wait_trial(
        self, trial_id: str, timeout: float | None = None, *, experiment_id: str | None = None
    ) -> TrialOutcome:
        return self._run(self._client.wait_trial(trial_id, timeout, experiment_id=experiment_id))

    def _iterate(self, records: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._run(records.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._loop.is_closed():
                self._run(records.aclose())  # type: ignore[attr-defined]

    def events(self, experiment_id: str, trial_id: str = "*") -> Iterator[TrialEvent]:
        return self._iterate(self._client.events(experiment_id, trial_id))

    def metrics(self, experiment_id: str, trial_id: str = "*") -> Iterator[MetricRecord]:
        return self._iterate(self._client.metrics(experiment_id, trial_id))
