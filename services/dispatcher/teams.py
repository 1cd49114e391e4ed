"""Teams' quotas and weights (KV bucket ``teams``), and what the platforms' sharing looks like now:
each team's use, quota and borrowed capacity, and the queue in order. A part of the dispatcher's
core; the policy itself is :mod:`.shares`.

Only an admin sets a team's share (``trialbus team set``, ``PUT /api/v1/teams/{team}``), audited
like every change; anyone may read them. The table is read once at start and kept by this
process, the only writer. The views cost O(teams × platforms + waiting experiments).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import nats.js.errors

from contracts import streams
from contracts.base import ContractError, utcnow
from contracts.people import Caller
from contracts.teams import Quota, Team
from services.common import kvwatch
from services.common.api import ApiError
from services.common.bus import Bus
from services.dispatcher.people import People, check_team
from services.dispatcher.placement import Placement
from services.dispatcher.shares import Capacity, Shares

log = logging.getLogger(__name__)

#: What ``PUT /api/v1/teams/{team}`` takes.
FIELDS = ("gpus", "trials", "weight", "platforms")


class Teams:
    """Teams' shares: set, removed, shown (the module's docstring)."""

    def __init__(self, bus: Bus, people: People, shares: Shares, placement: Placement) -> None:
        self._bus = bus
        self._people = people
        self._shares = shares
        self._placement = placement

    async def load(self) -> None:
        """Read the teams bucket (once, at start)."""
        for entry in await kvwatch.current(self._bus, streams.bucket_name(streams.TEAMS_BUCKET)):
            try:
                team = Team.decode(entry.value)
            except ContractError as exc:
                log.warning("ignoring the unreadable team %s: %s", entry.key, exc)
                continue
            self._shares.teams[team.name] = team

    async def set(self, caller: Caller, name: str, body: Any) -> dict[str, Any]:
        """Set a team's quota and weight (admins only); fields left out keep their value."""
        async with self._people.audited(caller, "team.set", name) as whose:
            whose.team = name if isinstance(name, str) else None
            _admin_only(caller, "set a team's quota")
            name = check_team(name)
            if not isinstance(body, dict):
                raise ApiError(422, 'expected a JSON object: {"gpus", "trials", "weight", "platforms"}')
            unknown = set(body) - set(FIELDS)
            if unknown:
                raise ApiError(422, f"unknown field(s) {', '.join(sorted(unknown))}; expected {', '.join(FIELDS)}")
            before = self._shares.teams.get(name) or Team(name=name)
            quota = {k: body[k] for k in ("gpus", "trials") if k in body}
            change: dict[str, Any] = {"updated": utcnow(), "updated_by": caller.name}
            try:
                if quota:
                    change["quota"] = Quota.model_validate({**before.quota.model_dump(), **quota})
                if "platforms" in body:
                    change["platforms"] = _platforms(body["platforms"])
                if "weight" in body:
                    change["weight"] = body["weight"]
                team = Team.model_validate({**before.model_dump(), **change})
            except ValueError as exc:
                raise ApiError(422, _said(exc)) from None
            await (await self._bus.kv(streams.bucket_name(streams.TEAMS_BUCKET))).put(name, team.encode())
            self._shares.teams[name] = team
            pools = "".join(f"; on {pool}: {quota.describe()}" for pool, quota in sorted(team.platforms.items()))
            log.info(
                "team %s: quota %s%s, weight %g (set by %s)",
                name,
                team.quota.describe(),
                pools,
                team.weight,
                caller.name,
            )
            return self.view_of(name)

    async def remove(self, caller: Caller, name: str) -> dict[str, Any]:
        """Forget a team's share (admins only): it is guaranteed nothing and weighs 1 again."""
        async with self._people.audited(caller, "team.remove", name) as whose:
            whose.team = name
            _admin_only(caller, "remove a team's quota")
            if name not in self._shares.teams:
                raise ApiError(404, f"team {name!r} has no quota set; `trialbus team list` shows the teams")
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                await (await self._bus.kv(streams.bucket_name(streams.TEAMS_BUCKET))).delete(name)
            view = self.view_of(name)
            del self._shares.teams[name]
            return view

    # ---------------------------------------------------------------- views

    def all(self) -> list[dict[str, Any]]:
        """Every team with a share set, or using or waiting for capacity: quota, weight, use per platform."""
        names = set(self._shares.teams)
        names |= {h.team for h in self._shares.holdings.values()}
        names |= {d.team for demands in self._shares.demands.values() for d in demands.values()}
        return [self.view_of(name) for name in sorted(names)]

    def view_of(self, name: str) -> dict[str, Any]:
        team = self._shares.teams.get(name) or Team(name=name)
        body = team.view()
        body["configured"] = name in self._shares.teams
        body["platforms"] = {k: v.model_dump(mode="json", by_alias=True) for k, v in team.platforms.items()}
        body["use"] = {}
        for pool in self._pools():
            capacity = self._placement.capacity(pool)
            use, quota = self._shares.used(pool, name), team.quota_on(pool)
            waiting = [d for d in self._shares.demands.get(pool, {}).values() if d.team == name]
            if not use.trials and not waiting and not capacity.bounded:
                continue
            body["use"][pool] = {
                "gpus": round(use.gpus, 6),
                "trials": use.trials,
                "quota": quota.model_dump(mode="json", by_alias=True),
                "borrowedGpus": round(max(0.0, use.gpus - (quota.gpus or 0.0)), 6),
                "borrowedTrials": None if quota.trials is None else max(0, use.trials - quota.trials),
                "waitingExperiments": len(waiting),
                "capacity": _capacity(capacity),
            }
        return body

    def queue(self, caller: Caller | None = None) -> list[dict[str, Any]]:
        """Each shared pool's waiting experiments in the order they get capacity, with why each waits."""
        found = []
        for pool in self._pools():
            capacity = self._placement.capacity(pool)
            ranked = self._shares.ranked(pool, capacity)
            if not ranked and not capacity.bounded:
                continue
            total = self._shares.total(pool)
            entries = [
                {
                    "position": i + 1,
                    "experiment": d.experiment,
                    "team": d.team,
                    "priority": d.priority,
                    "gpusPerTrial": round(d.gpus, 6),
                    "ready": d.want,
                    "why": self._shares.why(pool, d, capacity, i),
                }
                for i, d in enumerate(ranked)
            ]
            found.append(
                {
                    "platform": pool,
                    "capacity": _capacity(capacity),
                    "used": {"gpus": round(total.gpus, 6), "trials": total.trials},
                    "waiting": entries,
                }
            )
        return found

    def _pools(self) -> list[str]:
        """The adapters, their pools (remote machines' and OpenPAI virtual clusters the replicas report),
        and the pools trials hold or wait for. O(replicas × machines + trials holding capacity)."""
        statuses = self._placement.statuses.values()
        seen = {s.adapter for s in statuses}
        seen |= {f"{s.adapter}/{pool}" for s in statuses for m in s.machines for pool in m.pools}
        seen |= {f"{s.adapter}/{vc}" for s in statuses for c in s.clusters for vc in c.virtual_clusters}
        seen |= {h.pool for h in self._shares.holdings.values()}
        seen |= {p for p, demands in self._shares.demands.items() if demands}
        return sorted(seen)


def _capacity(capacity: Capacity) -> dict[str, Any]:
    return {"gpus": capacity.gpus, "trials": None if capacity.trials == math.inf else int(capacity.trials)}


def _platforms(value: Any) -> dict[str, Quota]:
    if not isinstance(value, dict):
        raise ValueError('platforms must be an object: {"local-gpu": {"gpus": 2, "trials": 4}, …}')
    return {str(adapter): Quota.model_validate(quota) for adapter, quota in value.items()}


def _admin_only(caller: Caller, what: str) -> None:
    if caller.role != "admin":
        raise ApiError(403, f"{caller.name} is a {caller.role}: only an admin may {what}")


def _said(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())) or 'value'}: {e.get('msg')}" for e in errors())
    return str(exc)
