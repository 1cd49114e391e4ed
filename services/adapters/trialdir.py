"""The trial directory's layout, once (stdlib only, Python >= 3.9).

Every adapter that runs the trial keeper itself keeps an attempt's files in one directory,
``<trials>/<experiment>/<trial>-<attempt>/``, the keeper's and the adapter's own under its
``.trialbus/`` (the paths below). The local-gpu adapter reads it on its host, the remote agent
on each SSH machine (this file is shipped beside ``agent.py``, as ``agent_checkpoints.py`` is),
and the shared-storage adapters (openpai, frameworkcontroller) on the share. A directory is
created once per attempt (the idempotency point of a launch), marked ``reported`` once the
attempt's end is published (it is then never adopted again), and removed ``retention``
seconds after that (:func:`remove_expired`).

The openpai reuse runner is shipped with this file too. The keeper (``services/trial_keeper/``)
spells the paths it writes itself (``.trialbus/state.json``, ``spool/``, ``keeper.log``, ``exit``,
``imports``, ``cancel``): it is imported by nothing and run as one file wherever a trial runs
(the shared storage of frameworkcontroller carries no helper beside it), and it stays free of
imports on its hot path.
"""

import contextlib
import os
import shutil
import stat

#: The adapter's and the keeper's files in a trial directory (the trial's own are beside them).
META = ".trialbus"
#: The keeper's record of the trial: pids, start and end, exit code (written atomically).
STATE = META + "/state.json"
#: The keeper's own stdout and stderr (its crashes); opened before the keeper runs a line.
KEEPER_OUT = META + "/keeper.out"
#: Written before a stop signal: a kept keeper stops its trial only with it.
CANCEL = META + "/cancel"
#: The attempt's end is published: it is not adopted again, and expires ``retention`` after its mtime.
REPORTED = META + "/reported"
#: Records the keeper could not deliver yet, one file per record (``%08d``).
SPOOL = META + "/spool"
#: The GPUs the attempt holds (local-gpu, remote): ``{"indices": […], "perGpu": n}``.
GPUS = META + "/gpus.json"
#: The trial's token (remote), for delivering its spool.
TOKEN = META + "/token"
#: The adapter replica that made the directory (shared storage: only that one adopts it).
REPLICA = META + "/replica"
#: The reuse runner was stopped while it ran the trial (openpai, per task directory).
ENVIRONMENT_STOPPED = META + "/environment-stopped"


def open_in(trial_dir, name, flags=os.O_RDONLY, mode=0o644):
    """A descriptor of ``<trial_dir>/<name>`` (``name`` relative: ``.trialbus/state.json``) found
    without following a symbolic link below ``trial_dir``, and without blocking on a FIFO. A trial
    that runs as another user owns its directory and could make any name in it a link to a file
    only the adapter may read or write (docs/security.md); the path up to ``trial_dir`` is the
    adapter's. OSError as ``os.open`` raises it (ELOOP: a link)."""
    fd = os.open(trial_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        *folders, last = name.split("/")
        for folder in folders:
            inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(last, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        os.close(fd)


def read_in(trial_dir, name, last=None):
    """The bytes of ``<trial_dir>/<name>`` (its ``last`` bytes when given), read as :func:`open_in`
    finds it; None when it is missing, or no regular file of its own (a link, a FIFO, a hard link to
    some other file)."""
    try:
        fd = open_in(trial_dir, name)
    except OSError:
        return None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
            return None
        if last is not None:
            os.lseek(fd, max(0, found.st_size - last), os.SEEK_SET)
        chunks, size = [], 0
        while last is None or size < last:
            chunk = os.read(fd, 65536 if last is None else last - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def attempt_dir(trials_dir, experiment_id, trial_id, attempt):
    """``<trials>/<experiment>/<trial>-<attempt>``: an attempt's directory (the caller checks that the
    ids are safe path parts)."""
    return f"{trials_dir}/{experiment_id}/{trial_id}-{attempt}"


def parse_name(name):
    """``(trial, attempt)`` of a directory named ``<trial>-<attempt>``; None for any other name."""
    trial_id, _, attempt = name.rpartition("-")
    return (trial_id, int(attempt)) if trial_id and attempt.isdigit() else None


def is_reported(trial_dir):
    return os.path.exists(trial_dir + "/" + REPORTED)


def mark_reported(trial_dir):
    """Mark the attempt's end published (OSError when its directory is gone); an earlier mark stays
    as it is, so its expiry does not move."""
    os.close(open_in(trial_dir, REPORTED, os.O_WRONLY | os.O_CREAT))


def attempts(experiment_dir):
    """``(trial, attempt, path)`` of each attempt's directory of an experiment, in name order; none
    when the experiment has no folder."""
    try:
        entries = sorted(os.scandir(experiment_dir), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        parsed = parse_name(entry.name)
        if parsed is not None and entry.is_dir():
            found.append((parsed[0], parsed[1], entry.path))
    return found


def unreported(trials_dir):
    """``(experiment, trial, attempt, path)`` of every attempt whose end was never published, by
    experiment: what a restarted adapter adopts."""
    found: list[tuple[str, str, int, str]] = []  # (a local's annotation is never evaluated: 3.9 runs it)
    for experiment in sorted(os.scandir(trials_dir), key=lambda e: e.name):
        if experiment.is_dir():
            found.extend(
                (experiment.name, trial_id, attempt, path)
                for trial_id, attempt, path in attempts(experiment.path)
                if not is_reported(path)
            )
    return found


def newest(experiment_dir, trial_id, attempt=None):
    """``(attempt, path)`` of a trial's attempt, the newest unless ``attempt`` names one; None when
    there is none (the caller checks that the ids are safe path parts)."""
    found = [
        (number, path)
        for name, number, path in attempts(experiment_dir)
        if name == trial_id and attempt in (None, number)
    ]
    return max(found) if found else None


def remove_expired(trials_dir, deadline):
    """Delete the attempts' directories reported before ``deadline`` (a ``time.time()``), and the
    experiments' folders they leave empty. ``(count removed, {(experiment, trial)} of the attempts
    not reported yet)``: their checkpoints stay."""
    removed, kept = 0, set()
    for experiment in os.scandir(trials_dir):
        if not experiment.is_dir():
            continue
        for entry in os.scandir(experiment.path):
            if not entry.is_dir():
                continue
            try:
                if os.path.getmtime(entry.path + "/" + REPORTED) < deadline:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
            except FileNotFoundError:  # running, or never reported
                kept.add((experiment.name, entry.name.rpartition("-")[0]))
            except NotADirectoryError:  # not a trial directory
                continue
        with contextlib.suppress(OSError):  # only when empty
            os.rmdir(experiment.path)
    return removed, kept
