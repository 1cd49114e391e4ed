"""Teams' shares of the platforms: each team's quota and weight (docs/teams.md).

A team's **quota** is the capacity it is guaranteed on a platform: GPUs and trial slots. It
may use more while capacity stands idle (it *borrows*), and what it borrows is taken back
(preempted) when a team under its quota needs it. Its **weight** sets its fair share of what
no quota guarantees: capacity that frees up goes to the waiting team with the smallest
dominant share (its larger fraction of the platform's GPUs or slots in use) divided by its weight.

A team without a quota is guaranteed nothing: everything it runs is borrowed. With no quota set
anywhere, teams simply share by weight and nothing is ever preempted for a quota. Teams are the
``team`` of the users (contracts/people.py); the KV bucket ``teams`` holds one :class:`Team`
per team that an admin configured (``trialbus team set``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator

from contracts.base import Contract
from contracts.nni import NniModel
from contracts.people import check_name


class Quota(NniModel):
    """Capacity guaranteed on one platform; None: nothing guaranteed of that resource."""

    #: GPUs (a trial holds ``trialGpuNumber`` ÷ ``maxTrialNumberPerGpu`` of them).
    gpus: float | None = Field(default=None, ge=0, le=100000)
    #: Trials running at once.
    trials: int | None = Field(default=None, ge=0, le=1000000)

    def describe(self) -> str:
        gpus = f"{_number(self.gpus)} GPUs" if self.gpus is not None else ""
        trials = f"{self.trials} trials" if self.trials is not None else ""
        return ", ".join(p for p in (gpus, trials) if p) or "none"


class Team(Contract):
    """One team's share (KV bucket ``teams``, key = team name)."""

    kind: Literal["team"] = "team"
    v: Literal[1] = 1
    name: str
    #: Its quota on every platform with finite capacity, unless ``platforms`` says otherwise.
    quota: Quota = Field(default_factory=Quota)
    #: Quotas per platform (the adapter's name, e.g. ``local-gpu``, ``remote``), replacing ``quota`` there.
    platforms: dict[str, Quota] = Field(default_factory=dict)
    #: Its weight in the fair share of what no quota guarantees (1 by default).
    weight: float = Field(default=1.0, gt=0, le=1000)
    updated: datetime | None = None
    updated_by: str | None = None

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        return check_name(value, "team")

    def quota_on(self, adapter: str) -> Quota:
        return self.platforms.get(adapter, self.quota)

    def view(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude={"kind", "v"})


def _number(value: float) -> str:
    return f"{value:g}"
