"""Spot and preemptible instances: the cloud's notice that this machine goes away soon.

A spot VM gets a short warning before the cloud reclaims it: two minutes on AWS, about 30 s
on Google Cloud and Azure. Set ``TRIALBUS_SPOT_NOTICE`` (``aws``, ``gcp`` or ``azure``) on
an adapter replica that runs on such a machine (the local adapter: its trials run here) and
it polls the instance metadata service every ``spot_notice_interval`` seconds; on a notice
it drains itself, as ``trialbus platform drain`` would: no new trials here, and each running
one is preempted (SIGTERM, the trial's grace period to save a checkpoint, SIGKILL), then run
again elsewhere without counting against its retry budget.

What each cloud answers (``spot_notice_url`` replaces the metadata address, for a proxy or
an emulator):

- **aws**: ``GET /latest/meta-data/spot/instance-action`` is 404 until a notice, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": ...}``. IMDSv2: a session token from
  ``PUT /latest/api/token`` first (IMDSv1, without one, is tried when the PUT is refused).
- **gcp**: ``GET /computeMetadata/v1/instance/preempted`` (header ``Metadata-Flavor: Google``)
  answers ``TRUE`` once the VM is being preempted.
- **azure**: ``GET /metadata/scheduledevents?api-version=2020-07-01`` (header ``Metadata: true``)
  lists scheduled events; one with ``EventType: Preempt`` is the notice.

A metadata service that cannot be reached is logged once (then at debug level) and asked
again at the next interval: not every machine that says spot is one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

import httpx

log = logging.getLogger(__name__)

Provider = Literal["aws", "gcp", "azure"]
METADATA = "http://169.254.169.254"
#: Seconds an AWS IMDSv2 token is asked for (the most AWS allows is 6 hours).
TOKEN_TTL = 21600


class SpotWatcher:
    """Polls the metadata service; calls ``on_notice(why)`` once, at the first notice."""

    def __init__(
        self, provider: Provider, url: str | None, interval: float, on_notice: Callable[[str], Awaitable[None]]
    ) -> None:
        self.provider, self.base, self.interval = provider, (url or METADATA).rstrip("/"), interval
        self.on_notice = on_notice
        self._token: str | None = None
        self._unreachable_said = False

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while True:
                try:
                    why = await self.check(http)
                except (httpx.HTTPError, ValueError) as exc:
                    self._unreachable(exc)
                    why = None
                if why is not None:
                    log.warning("spot notice from %s: %s", self.provider, why)
                    await self.on_notice(why)
                    return
                await asyncio.sleep(self.interval)

    async def check(self, http: httpx.AsyncClient) -> str | None:
        """The notice, in words, or None while there is none."""
        if self.provider == "aws":
            return await self._aws(http)
        if self.provider == "gcp":
            answer = await http.get(
                f"{self.base}/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
            )
            answer.raise_for_status()
            return "the VM is being preempted" if answer.text.strip().upper() == "TRUE" else None
        answer = await http.get(
            f"{self.base}/metadata/scheduledevents", params={"api-version": "2020-07-01"}, headers={"Metadata": "true"}
        )
        answer.raise_for_status()
        for event in answer.json().get("Events") or []:
            if event.get("EventType") == "Preempt":
                return f"Preempt scheduled, not before {event.get('NotBefore') or 'now'}"
        return None

    async def _aws(self, http: httpx.AsyncClient) -> str | None:
        if self._token is None:
            got = await http.put(
                f"{self.base}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}
            )
            self._token = got.text if got.status_code == 200 else ""  # "": IMDSv1
        headers = {"X-aws-ec2-metadata-token": self._token} if self._token else {}
        answer = await http.get(f"{self.base}/latest/meta-data/spot/instance-action", headers=headers)
        if answer.status_code == 401:  # the token expired: a new one next time
            self._token = None
            return None
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        notice = answer.json()
        return f"instance-action {notice.get('action', '?')} at {notice.get('time', '?')}"

    def _unreachable(self, exc: Exception) -> None:
        level = logging.DEBUG if self._unreachable_said else logging.WARNING
        log.log(
            level,
            "cannot read the %s spot notice at %s (%s); asking again in %.0fs",
            self.provider,
            self.base,
            exc,
            self.interval,
        )
        self._unreachable_said = True
