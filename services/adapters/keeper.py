"""What the adapters that run the trial keeper themselves (local-gpu on its host, remote
over SSH, openpai through a shared file system) share: fetching and unpacking a code
snapshot, and reading how a trial ended from the keeper's ``state.json``."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import nats.errors
from nats.js.errors import NotFoundError

from contracts import TrialStatus
from services.adapters.base import TrialOutcome
from services.adapters.errors import PermanentError, TransientError
from services.common.bus import Bus


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
    if hashlib.sha256(archive).hexdigest() != digest:
        raise PermanentError(f"code snapshot sha256:{digest} does not match its hash")
    return archive


class UnsafeArchive(ValueError):
    """A code snapshot that is not a tar.gz, or would write outside its directory."""


def extract_code(archive: bytes, dest: Path) -> None:
    """Unpack a code snapshot (tar.gz) into ``dest`` atomically.

    Unpacks into a temporary sibling, then renames it: a reader sees all of it or none.
    Members with absolute paths, ``..``, links leaving the tree or device files are
    refused (tarfile's ``data`` filter, plus an explicit check that names the member).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
                for member in tar.getmembers():
                    parts = Path(member.name).parts
                    if member.name.startswith("/") or ".." in parts:
                        raise UnsafeArchive(f"member {member.name!r} would be written outside the code directory")
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise UnsafeArchive(f"cannot unpack the code snapshot: {exc}") from exc
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():  # not "another process won the race"
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def outcome_of(state: dict, keeper_status: int | None, keeper_out: str | None = None) -> TrialOutcome:
    """How a trial ended, from the keeper's ``state.json`` once the keeper is gone (§1)."""
    end = datetime.fromtimestamp(state["endTime"], UTC) if state.get("endTime") else None
    exit_code = state.get("exitCode")
    if state.get("error"):
        return TrialOutcome(TrialStatus.FAILED, exit_code, str(state["error"]), "unknown", end)
    if exit_code is not None and state.get("done"):
        return TrialOutcome.exited(exit_code, end)
    if exit_code is not None:
        note = "the trial keeper was killed before it finished: metrics may be incomplete"
        return TrialOutcome.exited(exit_code, end, note=note)
    if state.get("done") and state.get("canceled"):
        return TrialOutcome(TrialStatus.FAILED, None, "stopped before the trial command started", "unknown", end)
    if keeper_status is None:
        why = "no exit status recorded"
    elif keeper_status < 0:
        why = f"killed by signal {-keeper_status}"
    else:
        why = f"exit status {keeper_status}"
    last = (keeper_out or "").strip().splitlines()[-1:]
    detail = f": {last[0][:200]}" if last else ""
    return TrialOutcome(TrialStatus.FAILED, None, f"trial keeper exited unexpectedly ({why}){detail}", "unknown", end)
