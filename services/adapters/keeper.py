"""What the adapters that run the trial keeper themselves (local-gpu on its host, remote
over SSH, openpai through a shared file system) share: fetching a code snapshot (checked
and unpacked by :mod:`services.common.code_archive`), and reading how a trial ended from
the keeper's ``state.json``."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import nats.errors
from nats.js.errors import NotFoundError

from contracts import TrialStatus
from services.adapters.base import TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.common.bus import Bus
from services.common.code_archive import UnsafeArchive, check_archive


class Bundle:
    """The files an adapter ships to where trials run — the keeper and the ``nni`` shim, plus
    ``extra`` (the remote agent) — and their content hash, which names their folder there,
    so they are copied once per content."""

    def __init__(self, keeper: Path, shim: Path, extra: dict[str, Path] | None = None) -> None:
        self.files: dict[str, bytes] = {"trial_keeper.py": keeper.read_bytes()}
        self.files.update((name, path.read_bytes()) for name, path in (extra or {}).items())
        for path in sorted(shim.rglob("*.py")):
            self.files[f"nni_shim/{path.relative_to(shim)}"] = path.read_bytes()
        digest = hashlib.sha256()
        for name, data in sorted(self.files.items()):
            digest.update(f"{name}\0{len(data)}\0".encode() + data)
        self.hash = digest.hexdigest()[:16]


async def fetch_code(bus: Bus, digest: str) -> bytes:
    """The tar.gz of code snapshot ``sha256:<digest>`` from the ``code`` object store, checked."""
    try:
        store = await bus.code_store()
        archive = (await store.get(digest)).data
    except NotFoundError as exc:
        raise PermanentError(f"code snapshot sha256:{digest} is not in the object store") from exc
    except (nats.errors.Error, OSError) as exc:
        raise TransientError(f"cannot download code snapshot sha256:{digest}: {exc}", delay=2.0) from exc
    assert archive is not None  # nats.py leaves data None only when told to write it into a file
    if hashlib.sha256(archive).hexdigest() != digest:
        raise PermanentError(f"code snapshot sha256:{digest} does not match its hash")
    return archive


async def fetch_checked_code(bus: Bus, digest: str) -> bytes:
    """:func:`fetch_code`, then every check of an unpacking (for the remote adapter, whose agent
    unpacks it on the machine): an unsafe snapshot fails the trial with the member's name."""
    archive = await fetch_code(bus, digest)
    try:
        await asyncio.to_thread(check_archive, archive)
    except UnsafeArchive as exc:
        raise PermanentError(f"code snapshot sha256:{digest}: {exc}") from None
    return archive


def outcome_of(state: dict, keeper_status: int | None, keeper_out: str | None = None) -> TrialOutcome:
    """How a trial ended, from the keeper's ``state.json`` once the keeper is gone (§1), with the
    failed trial's last stderr line (``lastError``, bounded and made printable by the event)."""
    outcome = _outcome_of(state, keeper_status, keeper_out)
    if outcome.status is TrialStatus.FAILED and isinstance(last := state.get("lastError"), str):
        return replace(outcome, last_error=last)
    return outcome


def _outcome_of(state: dict, keeper_status: int | None, keeper_out: str | None) -> TrialOutcome:
    end = datetime.fromtimestamp(state["endTime"], UTC) if state.get("endTime") else None
    exit_code = state.get("exitCode")
    if state.get("error"):  # the keeper could not run the command, or the gateway refused it: as again
        return TrialOutcome(TrialStatus.FAILED, exit_code, str(state["error"]), "permanent", end)
    if exit_code is not None and state.get("done"):
        return TrialOutcome.exited(exit_code, end)
    if exit_code is not None:
        note = "the trial keeper was killed before it finished: metrics may be incomplete"
        return TrialOutcome.exited(exit_code, end, note=note)
    if state.get("done") and state.get("canceled"):
        return TrialOutcome(TrialStatus.FAILED, None, "stopped before the trial command started", "infrastructure", end)
    if keeper_status is None:
        why = "no exit status recorded"
    elif keeper_status < 0:
        why = f"killed by signal {-keeper_status}"
    else:
        why = f"exit status {keeper_status}"
    last = (keeper_out or "").strip().splitlines()[-1:]
    detail = f": {last[0][:200]}" if last else ""
    return TrialOutcome(
        TrialStatus.FAILED, None, f"trial keeper exited unexpectedly ({why}){detail}", "infrastructure", end
    )
