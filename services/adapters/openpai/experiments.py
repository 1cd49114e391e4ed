"""The openpai experiments the dispatcher keeps, as the openpai adapter reads them from the bus:
all of them (adoption after a restart), or one experiment's ``trainingService`` (moving a
reuse-mode trial to another environment, the logs of a past attempt)."""

from __future__ import annotations

from contracts import ExperimentState
from contracts.experiment import OpenpaiConfig
from services.common import platforms
from services.common.bus import Bus


class Experiments:
    """The experiments that run on OpenPAI; ``bus`` is set when the adapter starts."""

    def __init__(self, adapter: str) -> None:
        self._adapter = adapter
        self.bus: Bus | None = None

    async def all(self) -> list[tuple[ExperimentState, OpenpaiConfig]]:
        """Every experiment with an openpai ``trainingService``, and that service."""
        found = []
        if self.bus is None:
            raise RuntimeError("the openpai adapter is not started")
        for state in await platforms.experiments(self.bus):
            service = state.config.service_for(self._adapter)
            if isinstance(service, OpenpaiConfig):
                found.append((state, service))
        return found

    async def service(self, experiment_id: str) -> OpenpaiConfig | None:
        """The experiment's openpai ``trainingService``; None when it is gone (or not on OpenPAI)."""
        for state, service in await self.all():
            if state.id == experiment_id:
                return service
        return None
