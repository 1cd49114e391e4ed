"""The OpenPAI rest-server v2 jobs API, as the openpai adapter uses it (httpx, async).

Every call goes to ``<host>/rest-server/api/v2/...`` with ``Authorization: Bearer <token>``;
:func:`error_of` turns every HTTP answer the server gives into the adapter's error classes
in one place: 401 (the token), 403 (a virtual cluster or a job that is not ours), 429 (too
many submissions: back off, as long as the server says), 5xx and network errors
(transient), 400 (a job the server refuses: permanent, with its reasons). Certificates are
always verified, against ``TRIALBUS_OPENPAI_CA_BUNDLE`` when a cluster uses its own CA; one
that does not verify is permanent (retrying cannot help, the setting can), and the message
names the setting. Each client also keeps the GPUs of the cluster's virtual clusters, as the
adapter last read them (teams' quotas on ``openpai/<vc>`` share them). :class:`Clients` keeps
one client per cluster, user and token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import ssl
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from contracts.base import utcnow
from contracts.experiment import OpenpaiConfig
from services.adapters.errors import AdapterError, PermanentError, TransientError

log = logging.getLogger(__name__)

#: Job states after which a job never changes again.
FINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


class JobExists(AdapterError):
    """409: a job of that name exists already (ours, from before a restart)."""


class OpenpaiClient:
    """One cluster, one user."""

    def __init__(
        self, host: str, username: str, token: str, ca_bundle: Path | None, timeout: float, rate_limit_backoff: float
    ) -> None:
        self.host, self.username = host.rstrip("/"), username
        self.rate_limit_backoff = rate_limit_backoff
        self._cooldown_until = 0.0  # monotonic: no submission before (after a 429)
        self._cooldown = 0.0  # seconds of the last back-off, doubled at each 429 in a row
        self.error: str | None = None  # why the last job-list read failed
        #: GPUs of each virtual cluster (``resourcesTotal``) as the last successful read said,
        #: and when (wall clock; None before the first): the teams' quotas on ``openpai/<vc>``.
        self.virtual_clusters: dict[str, float] = {}
        self.virtual_clusters_at: datetime | None = None
        self._vc_tried: float | None = None  # monotonic: the last read, successful or not
        self._vc_error: str | None = None  # the last failed read's error, said once
        verify = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle else True
        self._http = httpx.AsyncClient(
            base_url=f"{self.host}/rest-server/api/v2",
            timeout=timeout,
            headers={"Authorization": f"Bearer {token}"},
            verify=verify,
        )

    async def close(self) -> None:
        await self._http.aclose()

    def paused_for(self) -> float | None:
        """Seconds until submissions resume after a 429; None when they are not paused."""
        wait = self._cooldown_until - time.monotonic()
        return round(wait, 1) if wait > 0 else None

    def framework(self, job: str) -> str:
        """``user~job``: the path segment naming a job."""
        return f"{self.username}~{job}"

    async def submit(self, job_yaml: str, job: str) -> None:
        """``POST /jobs`` (the protocol as YAML text); JobExists on 409.

        After a 429 no submission goes out until the back-off has passed (the server's
        ``Retry-After``, else doubling while it keeps refusing, up to ``rate_limit_backoff``):
        a storm of launches waits together instead of hammering the limit."""
        wait = self._cooldown_until - time.monotonic()
        if wait > 0:
            raise TransientError(f"OpenPAI rate limit: next submission in {wait:.0f}s", delay=wait)
        reply = await self._request("POST", "/jobs", content=job_yaml.encode(), headers={"Content-Type": "text/yaml"})
        if reply.status_code == 429:
            error, now = rate_limited(reply, f"submitting job {self.framework(job)}"), time.monotonic()
            if now >= self._cooldown_until:  # a new refusal, not another answer of the same burst
                told = reply.headers.get("Retry-After", "").isdigit()  # the server says when: believe it
                self._cooldown = min(error.delay if told else max(self._cooldown * 2, 1.0), self.rate_limit_backoff)
                self._cooldown_until = now + self._cooldown
            raise TransientError(f"{error} in {self._cooldown_until - now:.0f}s", delay=self._cooldown_until - now)
        self._cooldown = 0.0
        if reply.status_code == 409:
            raise JobExists(f"job {self.framework(job)} exists")
        if reply.status_code != 202:
            raise error_of(reply, f"submitting job {self.framework(job)}")

    async def job(self, job: str) -> dict[str, Any] | None:
        """The job's detail (``jobStatus``, ``taskRoles``); None when the server has no such job."""
        reply = await self._request("GET", f"/jobs/{self.framework(job)}")
        if reply.status_code == 404:
            return None
        if reply.status_code != 200:
            raise error_of(reply, f"reading job {self.framework(job)}")
        return reply.json()

    async def attempt(self, job: str, attempt_id: int) -> dict[str, Any] | None:
        """The job's detail as of one of its attempts (``GET /jobs/{user~job}/attempts/{id}``: OpenPAI
        keeps each retry's exit spec there); None when the server has no such attempt."""
        reply = await self._request("GET", f"/jobs/{self.framework(job)}/attempts/{attempt_id}")
        if reply.status_code == 404:
            return None
        if reply.status_code != 200:
            raise error_of(reply, f"reading attempt {attempt_id} of job {self.framework(job)}")
        return reply.json()

    async def jobs(self, keyword: str) -> list[dict[str, Any]]:
        """This user's jobs whose name contains ``keyword`` (JobSummary: name, state, …)."""
        params = {"username": self.username, "keyword": keyword, "limit": "50000"}
        reply = await self._request("GET", "/jobs", params=params)
        if reply.status_code != 200:
            raise error_of(reply, "listing jobs")
        found = reply.json()
        return found["data"] if isinstance(found, dict) else found

    async def stop(self, job: str) -> None:
        """``PUT /jobs/{user~job}/executionType {"value": "STOP"}``; a job already gone is no error."""
        reply = await self._request("PUT", f"/jobs/{self.framework(job)}/executionType", json={"value": "STOP"})
        if reply.status_code not in (200, 202, 404):
            raise error_of(reply, f"stopping job {self.framework(job)}")

    async def check(self, virtual_cluster: str | None, storage: str) -> list[str]:
        """What stops this user from running jobs here: the token, the storage config."""
        problems = []
        reply = await self._request("GET", "/jobs", params={"username": self.username, "limit": "1"})
        if reply.status_code != 200:
            return [str(error_of(reply, "checking the token"))]
        reply = await self._request("GET", "/storages")
        if reply.status_code == 200:
            names = {s.get("name") for s in _items(reply.json())}
            if names and storage not in names:
                problems.append(
                    f"storageConfigName {storage!r} is not a storage of {self.host} "
                    f"(it has {', '.join(sorted(map(str, names)))})"
                )
        return problems

    def virtual_clusters_due(self, every: float) -> bool:
        """Whether the virtual clusters' GPUs were never read, or last read ``every`` seconds ago."""
        return self._vc_tried is None or time.monotonic() - self._vc_tried >= every

    async def read_virtual_clusters(self) -> dict[str, float]:
        """``GET /virtual-clusters``: each virtual cluster's GPUs, kept in ``virtual_clusters``.

        A failed read keeps the last answer (a cluster that cannot say its GPUs still runs
        jobs) and is logged once, at INFO, until it changes or a read works again."""
        self._vc_tried = time.monotonic()
        try:
            reply = await self._request("GET", "/virtual-clusters")
            if reply.status_code != 200:
                raise error_of(reply, "reading the virtual clusters")
            found = vc_gpus(reply.json())
        except (AdapterError, ValueError) as exc:  # ValueError: a body that is not JSON
            error = str(exc)
            log.log(logging.INFO if error != self._vc_error else logging.DEBUG, "%s: %s", self.host, error)
            self._vc_error = error
            return self.virtual_clusters
        self.virtual_clusters, self.virtual_clusters_at, self._vc_error = found, utcnow(), None
        return found

    async def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            chain: list[BaseException] = [exc]  # httpx's ConnectError <- httpcore's <- the ssl module's error
            while len(chain) < 8 and (cause := chain[-1].__cause__ or chain[-1].__context__) is not None:
                chain.append(cause)
            unverified = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
            if isinstance(exc, httpx.ConnectError) and (unverified or "CERTIFICATE_VERIFY_FAILED" in str(exc)):
                reason = (getattr(unverified, "verify_message", None) or str(exc)).rstrip(".")  # "self-signed …"
                raise PermanentError(
                    f"cannot verify the HTTPS certificate of {self.host}: {reason}; if the cluster uses its own CA, "
                    "set TRIALBUS_OPENPAI_CA_BUNDLE on the openpai adapter to that CA's certificate bundle (PEM)"
                ) from None
            raise TransientError(f"cannot reach OpenPAI at {self.host}: {exc}", delay=2.0) from None


class Clients:
    """The adapter's clients: one per cluster, user and token, made on first use and kept."""

    def __init__(self, ca_bundle: Path | None, timeout: float, rate_limit_backoff: float) -> None:
        self._ca_bundle, self._timeout, self._rate_limit_backoff = ca_bundle, timeout, rate_limit_backoff
        self._by_key: dict[tuple[str, str, str], OpenpaiClient] = {}

    def get(self, service: OpenpaiConfig) -> OpenpaiClient:
        """The client of the experiment's cluster, user and token."""
        token = service.token.get_secret_value()
        key = (service.host, service.username, hashlib.sha256(token.encode()).hexdigest())
        if (found := self._by_key.get(key)) is None:
            found = self._by_key[key] = OpenpaiClient(
                service.host, service.username, token, self._ca_bundle, self._timeout, self._rate_limit_backoff
            )
        return found

    def __iter__(self) -> Iterator[OpenpaiClient]:
        return iter(list(self._by_key.values()))

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._by_key.values()), return_exceptions=True)


def _items(body: Any) -> list[dict]:
    if isinstance(body, dict):
        body = body.get("data", body.get("storages", []))
    return [item for item in body if isinstance(item, dict)] if isinstance(body, list) else []


def vc_gpus(body: Any) -> dict[str, float]:
    """``{vc: gpus}`` from a ``GET /virtual-clusters`` answer: ``resourcesTotal.gpu`` (OpenPAI
    v1.x), else ``GPUs`` (some versions); a virtual cluster with neither, or with something
    that is not a number, is left out."""
    found: dict[str, float] = {}
    for name, vc in body.items() if isinstance(body, dict) else ():
        total = vc.get("resourcesTotal") if isinstance(vc, dict) else None
        if not isinstance(total, dict):
            continue
        for key in ("gpu", "GPUs"):
            gpus = total.get(key)
            if isinstance(gpus, int | float) and not isinstance(gpus, bool) and math.isfinite(gpus):
                found[str(name)] = float(gpus)
                break
    return found


def rate_limited(reply: httpx.Response, doing: str) -> TransientError:
    """The error for a 429 answer: retried after its ``Retry-After`` (1s without one)."""
    retry_after = reply.headers.get("Retry-After", "")
    delay = float(retry_after) if retry_after.isdigit() else 0.0
    return TransientError(f"OpenPAI rate limit while {doing} (429): retrying", delay=delay or 1.0)


def error_of(reply: httpx.Response, doing: str) -> AdapterError:
    """The adapter error for an answer of the rest-server (never includes the token)."""
    try:
        body = reply.json()
        message = str(body.get("message", "")) if isinstance(body, dict) else str(body)
        code = body.get("code", "") if isinstance(body, dict) else ""
    except (ValueError, json.JSONDecodeError):
        message, code = reply.text[:500], ""
    status, where = reply.status_code, str(reply.request.url.copy_with(query=None))
    if status == 401:
        return PermanentError(
            f"OpenPAI refused the token while {doing} (401 {code}: {message}); set trainingService.token to a "
            "valid token for the user (an application token from the web portal never expires)"
        )
    if status == 403:
        return PermanentError(f"OpenPAI forbids {doing} (403 {code}: {message})")
    if status == 429:
        return rate_limited(reply, doing)
    if status == 400:
        return PermanentError(f"OpenPAI refused {doing} (400 {code}): {message}")
    if status == 404:
        return PermanentError(f"OpenPAI has no {where} (404 {code}: {message})")
    if status >= 500:
        return TransientError(f"OpenPAI failed {doing} ({status} {code}: {message})", delay=5.0)
    return PermanentError(f"unexpected answer {status} from OpenPAI while {doing}: {message}")
