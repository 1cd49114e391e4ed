"""The shared file system of the adapters whose trials run in containers (openpai,
frameworkcontroller): a share mounted on the adapter's host and, under another path, in
every container. Everything a trial needs and leaves goes through it, under ``trialbus/``::

    bin/<hash>/                    the keeper, the ``nni`` shim (and the reuse runner), once per content
    code/<sha256>/                 a code snapshot, unpacked once: the trials' working directory
    checkpoints/<exp>/<trial>/     the trial's checkpoint directory, kept across its attempts
    trials/<exp>/<trial>-<attempt>/
        .trialbus/quiet.env        the keeper's settings for every task (0600)
        .trialbus/report.env       the same plus the gateway and the trial's token: the reporting task only
        .trialbus/replica          the adapter replica that made it (only that one adopts it)
        .trialbus/reported         its end is published
        <role>-<index>/            one task's trial directory (stdout, stderr, .trialbus/state.json)

The ``trials/`` part is the layout every adapter that runs the keeper shares (:mod:`.trialdir`).

A task runs its role's commands under the keeper with :func:`wrap`; the commands go to a
private temporary file of the container, never to the share (once a platform rendered them,
they may hold its secrets).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from contracts import TrialRequest
from services.adapters import trialdir
from services.adapters.base import AdapterSettings
from services.adapters.errors import PermanentError
from services.adapters.keeper import Bundle, fetch_code
from services.common import tokens
from services.common.bus import Bus
from services.common.code_archive import UnsafeArchive, extract_code

MARK = "TRIALBUS_COMMAND"


class ShareSettings(AdapterSettings):
    """Settings of every adapter whose trials run in containers on a shared storage."""

    #: Base URL of the metrics gateway as the containers reach it.
    gateway_url: str = "http://127.0.0.1:8081"
    #: Seconds a keeper keeps retrying unsent metrics after its trial ended.
    flush_timeout: float = Field(default=600.0, ge=0)
    #: Seconds one request to the platform's API may take.
    request_timeout: float = Field(default=30.0, gt=0)
    #: Seconds a trial's job may wait in the platform's queue before its message says so.
    queue_note_after: float = Field(default=10.0, ge=0)


@dataclass(frozen=True)
class Share:
    """One folder of the share, as the adapter (``local``) and the containers (``container``) see it."""

    local: str
    container: str

    def at(self, where: str) -> Share:
        return Share(f"{self.local.rstrip('/')}/{where}", f"{self.container.rstrip('/')}/{where}")


def trial_share(root: Share, experiment_id: str, trial_id: str, attempt: int) -> Share:
    return root.at(trialdir.attempt_dir("trialbus/trials", experiment_id, trial_id, attempt))


def install(bundle: Bundle, root: str) -> str:
    """The bundle under ``<root>/trialbus/bin/<hash>/``, once per content hash; the hash."""
    folder = Path(root) / "trialbus" / "bin" / bundle.hash
    if not (folder / ".complete").exists():
        # A scratch folder of this call's own: two launches (threads of one replica) may install at once.
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{bundle.hash}-", dir=folder.parent))
        tmp.chmod(0o755)  # as mkdir would make it: the trials (other users, containers) read the bundle
        for name, data in bundle.files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)
        (tmp / ".complete").touch()
        try:
            tmp.rename(folder)
        except OSError:  # another replica installed it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return bundle.hash


async def unpack_code(bus: Bus, root: str, code_ref: str) -> str:
    """The code snapshot under ``<root>/trialbus/code/<sha256>/``, once; its digest."""
    digest = code_ref.removeprefix("sha256:")
    dest = Path(root) / "trialbus" / "code" / digest
    if not dest.is_dir():
        archive = await fetch_code(bus, digest)
        try:
            await asyncio.to_thread(extract_code, archive, dest)
        except UnsafeArchive as exc:
            raise PermanentError(f"code snapshot sha256:{digest}: {exc}") from exc
    return digest


def keeper_settings(
    request: TrialRequest, root: Share, bin_hash: str, code: str | None, platform: str, flush_timeout: float
) -> dict[str, str]:
    """The keeper's settings every task of the trial gets (``quiet.env``)."""
    settings = {
        "TRIALBUS_EXPERIMENT_ID": request.experiment_id,
        "TRIALBUS_TRIAL_ID": request.trial_id,
        "TRIALBUS_SEQUENCE_ID": str(request.sequence_id),
        "TRIALBUS_ATTEMPT": str(request.attempt),
        # on the share, so every attempt finds it wherever it runs
        "TRIALBUS_CHECKPOINT_DIR": f"{root.container}/trialbus/checkpoints/{request.experiment_id}/{request.trial_id}",
        "TRIALBUS_PARAMETERS": request.parameter_record,
        "TRIALBUS_NNI_PLATFORM": platform,
        "TRIALBUS_FLUSH_TIMEOUT": str(flush_timeout),
        "TRIALBUS_PYTHONPATH_PREPEND": f"{root.container}/trialbus/bin/{bin_hash}/nni_shim",
        # for a reuse-mode environment's runner: fork the trial from its warm template (docs/warm-start.md)
        "TRIALBUS_WARM": "1" if request.warm_start else "0",
        "TRIALBUS_WARM_PRELOAD": ",".join(request.warm_preload),
    }
    if code is not None:
        settings["TRIALBUS_CODE_DIR"] = f"{root.container}/trialbus/code/{code}"
    if request.heartbeat:
        settings["TRIALBUS_HEARTBEAT"] = str(request.heartbeat)
    if request.grace_period is not None:  # within the platform's own (a pod's terminationGracePeriodSeconds)
        settings["TRIALBUS_KILL_GRACE"] = str(request.grace_period)
    return settings


async def prepare(
    bus: Bus, bundle: Bundle, root: Share, share: Share, request: TrialRequest, platform: str, settings: ShareSettings
) -> tuple[str, bool]:
    """Everything an attempt needs on the storage: the bundle and the code (once each), and
    the attempt's folder ``share`` with the keeper's settings. The bundle's hash, and False
    when the folder existed (the attempt was launched before)."""
    bin_hash = await asyncio.to_thread(install, bundle, root.local)
    code = await unpack_code(bus, root.local, request.code_ref) if request.code_ref else None
    quiet = keeper_settings(request, root, bin_hash, code, platform, settings.flush_timeout)
    report = {
        **quiet,
        "TRIALBUS_GATEWAY_URL": settings.gateway_url,
        "TRIALBUS_TRIAL_TOKEN": request.token.get_secret_value(),
        # the trial's own credential to ask its study (docs/optuna.md), never the keeper's token
        "TRIALBUS_ASK_TOKEN": tokens.ask_token(request.token.get_secret_value(), request.owner),
        "TRIALBUS_ASK_OWNER": request.owner or "",
    }
    fresh = await asyncio.to_thread(write_trial_dir, share.local, quiet, report, settings.replica)
    return bin_hash, fresh


def write_trial_dir(folder: str, quiet: dict[str, str], report: dict[str, str], replica: str) -> bool:
    """The attempt's folder with the keeper's two settings files and the replica that owns it;
    False when it existed (creating it is the idempotency point: a trial never runs twice)."""
    path = Path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        return False
    (path / trialdir.META).mkdir()
    (path / trialdir.REPLICA).write_text(replica)
    for name, values in (("quiet.env", quiet), ("report.env", report)):
        fd = os.open(path / trialdir.META / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(settings_file(values))
    return True


def owned_by(folder: Path, replica: str) -> bool:
    """Whether adapter replica ``replica`` made this folder: its ``replica`` file says."""
    try:
        return (folder / "replica").read_text() == replica
    except OSError:
        return False


def unreported(root: str, experiment_id: str, replica: str) -> list[tuple[str, int, Path]]:
    """(trial, attempt, folder) of this replica's attempts of an experiment whose end was never published."""
    return [
        (trial_id, attempt, Path(folder))
        for trial_id, attempt, folder in trialdir.attempts(f"{root}/trialbus/trials/{experiment_id}")
        if owned_by(Path(folder, trialdir.META), replica) and not trialdir.is_reported(folder)
    ]


def newest_attempt(root: str, experiment_id: str, trial_id: str, attempt: int | None = None) -> tuple[int, Path] | None:
    """The folder of a trial's attempt, the newest by default (for its logs once it ended)."""
    found = trialdir.newest(f"{root}/trialbus/trials/{experiment_id}", trial_id, attempt)
    return (found[0], Path(found[1])) if found else None


def mark_reported(folder: str) -> None:
    """The attempt's end is published (its expiry counts from now: a mark again moves it)."""
    with contextlib.suppress(OSError):
        (Path(folder) / trialdir.REPORTED).touch()


def keeper_state(folder: str, task: str) -> dict:
    """The keeper's ``state.json`` of one task of the trial (``<role>-<index>``); {} when none."""
    try:
        found = json.loads((Path(folder) / task / trialdir.STATE).read_bytes())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def log_tail(folder: str, max_bytes: int) -> str:
    """The tails of every task's stdout and stderr."""
    parts = []
    for task in sorted(Path(folder).glob("*-*")):
        for name in ("stdout", "stderr"):
            with contextlib.suppress(OSError):
                data = (task / name).read_bytes()[-max_bytes:]
                parts.append(f"==> {task.name}/{name} <==\n{data.decode(errors='replace')}")
    return "\n".join(parts)


def wrap(commands: list[str], reports: bool, trial_dir: str, keeper: str, role_var: str, index_var: str) -> list[str]:
    """Shell lines that run a task's commands under the keeper (``role_var`` / ``index_var``:
    the platform's variables naming the task's role and index)::

        T=<trial dir>/$ROLE-$INDEX && mkdir -p $T/.trialbus && C=$(mktemp) && cat > $C <<'TRIALBUS_COMMAND'
        trap 'exit 143' TERM
        <the commands, one per line>
        TRIALBUS_COMMAND
        TRIALBUS_TRIAL_DIR=$T TRIALBUS_TRIAL_COMMAND="sh $C" python3 -S -I <keeper> --env <settings> & \\
            K=$!; trap 'kill -TERM $K' TERM INT; wait $K; S=$?; <wait again while K runs>; rm -f "$C"; exit $S

    The first task of the reporting role reads ``report.env``, every other ``quiet.env``. The
    keeper runs in the background of this shell, which passes SIGTERM on to it: in a container
    the shell is process 1, which ignores signals it has no handler for, so a pod's deletion
    or preemption would otherwise never reach the keeper, and the trial would get no grace
    period to save a checkpoint (docs/retries.md)."""
    task = f'{trial_dir}/"${role_var}"-"${index_var}"'
    meta = f"{trial_dir}/{trialdir.META}"
    settings = f"{meta}/quiet.env"
    if reports:
        settings = f'"$([ "${index_var}" = 0 ] && echo {meta}/report.env || echo {meta}/quiet.env)"'
    return [
        f'T={task} && mkdir -p "$T/{trialdir.META}" && C=$(mktemp) && cat > "$C" <<\'{MARK}\'',
        # SIGTERM to the trial's group: this shell waits for the command it runs (which gets the signal
        # too, and may save a checkpoint in its grace period) before it ends, rather than at once
        "trap 'exit 143' TERM",
        *(command.strip() for command in commands),
        MARK,
        f'TRIALBUS_TRIAL_DIR="$T" TRIALBUS_TRIAL_COMMAND="sh $C" python3 -S -I {keeper} --env {settings} & '
        'K=$!; trap \'kill -TERM "$K" 2>/dev/null\' TERM INT; wait "$K"; S=$?; '
        'while kill -0 "$K" 2>/dev/null; do wait "$K"; S=$?; done; rm -f "$C"; exit $S',
    ]


def settings_file(values: dict[str, str]) -> bytes:
    """A keeper settings file (``--env``): KEY=VALUE items separated by NUL."""
    return b"".join(f"{key}={value}".encode() + b"\0" for key, value in values.items() if "\0" not in value)
