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

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator

from contracts.base import Contract
from contracts.nni import NniModel
from contracts.people import check_name

#: A pool's name: a remote ``trainingService.pool``, an OpenPAI virtual cluster.
POOL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
POOL_RULE = "1 to 64 characters: letters, digits, '.', '-' and '_', starting with a letter or digit"


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
    #: Quotas per platform (the adapter's name, e.g. ``local-gpu``, ``remote``) or per pool of one
    #: (``remote/<pool>``, ``openpai/<virtualCluster>``), replacing ``quota`` there.
    platforms: dict[str, Quota] = Field(default_factory=dict)
    #: Its weight in the fair share of what no quota guarantees (1 by default).
    weight: float = Field(default=1.0, gt=0, le=1000)
    updated: datetime | None = None
    updated_by: str | None = None

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        return check_name(value, "team")

    @field_validator("platforms")
    @classmethod
    def _pools(cls, value: dict[str, Quota]) -> dict[str, Quota]:
        for key in value:
            adapter, _, pool = key.partition("/")
            check_name(adapter, "platform")
            if "/" in key and not POOL.match(pool):
                raise ValueError(f"pool {pool!r} of {key!r} is not a valid name: {POOL_RULE}")
        return value

    def quota_on(self, pool: str) -> Quota:
        """The quota on ``pool`` (``<adapter>`` or ``<adapter>/<name>``): the pool's own, else its
        platform's, else the team's ``quota``."""
        found = self.platforms.get(pool) or self.platforms.get(pool.partition("/")[0])
        return found if found is not None else self.quota

    def view(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude={"kind", "v"})


def _number(value: float) -> str:
    return f"{value:g}"
