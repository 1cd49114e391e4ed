"""The experiments the dispatcher keeps, as the frameworkcontroller adapter reads them from the
bus: the ones on Kubernetes with their ``trainingService`` (adoption after a restart, the logs
of a past attempt), or every experiment's status (whether an experiment's Secret may go)."""

from __future__ import annotations

from contracts import ExperimentState, ExperimentStatus
from contracts.frameworkcontroller import FrameworkcontrollerConfig
from services.common import platforms
from services.common.bus import Bus


class Experiments:
    """The experiments on the bus; ``bus`` is set when the adapter starts."""

    def __init__(self, adapter: str) -> None:
        self._adapter = adapter
        self.bus: Bus | None = None

    def _started(self) -> Bus:
        if self.bus is None:
            raise RuntimeError("the frameworkcontroller adapter is not started")
        return self.bus

    async def all(self) -> list[tuple[ExperimentState, FrameworkcontrollerConfig]]:
        """Every experiment with a frameworkcontroller ``trainingService``, and that service."""
        found = []
        for state in await platforms.experiments(self._started()):
            service = state.config.service_for(self._adapter)
            if isinstance(service, FrameworkcontrollerConfig):
                found.append((state, service))
        return found

    async def statuses(self) -> dict[str, ExperimentStatus]:
        """The status of every experiment, by id (on any platform)."""
        return {s.id: s.status for s in await platforms.experiments(self._started())}
