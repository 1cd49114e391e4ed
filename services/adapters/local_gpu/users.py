"""The Unix user local trials run as, and the files that user may touch (docs/security.md).

A trial runs user code: the keeper that starts it, the keeper zygote and the warm templates (which
import the trial's modules) all run as the *trial user*, never as the adapter's own user, so no
trial reads the stack's credentials (``<data>/client.json``, ``api-token``…: mode 0600), the
services' environments (``/proc/<pid>/environ`` of another user), or finished trials' files.
``TRIALBUS_TRIAL_USER`` chooses it (:func:`choose`):

- ``auto`` (default): an adapter running as root uses the system user :data:`DEFAULT_USER`,
  created on first start (``useradd --system``: no home, no login shell); one that is not root
  cannot switch users, so its trials run as itself, *not isolated*, which it logs once at start;
- a user name: that user; the start fails when it does not exist, or the adapter (not root)
  cannot switch to it. The adapter's own user turns isolation off on purpose.

Switching: the adapter starts keepers as root with ``TRIALBUS_RUN_AS=<uid>:<gid>:<groups>``, and the
keeper (or the zygote, before it forks any) becomes that user before it reads a setting or runs a
trial (``trial_keeper.run_as``); a template is started as that user (``subprocess``'s ``user``).

Files (:class:`TrialUsers`): the adapter's folders (``trials/``, each experiment's, ``code/``,
``templates/``, the checkpoint root and its experiments') belong to the adapter, mode 0711: the
trial user passes through them to its own, and lists none. An attempt's directory and its
checkpoint directory are handed to the trial user at launch (mode 0700) and taken back once the
attempt's end is published: a later trial reads no finished trial's files. Trials that run at the
same time as the same user are not isolated from each other (:meth:`TrialUsers.trial_user_for` is where a
user per team would be chosen).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass

from contracts import TrialRequest

#: The user an adapter running as root runs trials as, under ``TRIALBUS_TRIAL_USER=auto``.
DEFAULT_USER = "trialbus-trial"
#: The adapter's folders trials pass through (never list); an attempt's own directories.
PASS_THROUGH, PRIVATE = 0o711, 0o700

log = logging.getLogger(__name__)


class TrialUserError(RuntimeError):
    """The trial user cannot be used: the adapter does not start."""


@dataclass(frozen=True)
class TrialUser:
    """A Unix user trials run as."""

    name: str
    uid: int
    gid: int
    #: Supplementary groups (the user's own, e.g. ``render`` for GPUs behind a group).
    groups: tuple[int, ...]
    #: Whether processes switch to it: False when it is the adapter's own user (not isolated).
    switch: bool

    def run_as(self) -> str:
        """The keeper's ``TRIALBUS_RUN_AS``."""
        return f"{self.uid}:{self.gid}:{','.join(map(str, self.groups))}"


def choose(setting: str, euid: int) -> str | None:
    """The user ``TRIALBUS_TRIAL_USER=setting`` names for an adapter running as ``euid``; None: the
    adapter's own (``auto`` when it is not root, so it cannot switch)."""
    if setting == "auto":
        return DEFAULT_USER if euid == 0 else None
    return setting


def resolve(setting: str) -> TrialUser:
    """The trial user of ``TRIALBUS_TRIAL_USER=setting`` (the module's docstring), created when it
    is ``auto``'s and missing. Raises :class:`TrialUserError` when it cannot be used."""
    euid = os.geteuid()
    own = pwd.getpwuid(euid).pw_name
    name = choose(setting, euid)
    if name is None:
        log.warning(
            "trials run as this adapter's own user %s and are NOT isolated from the stack: they can read its "
            "credentials (client.json, api-token in the data dir), the services' environments and other trials' "
            "files. Only an adapter running as root can run them as another user (TRIALBUS_TRIAL_USER).",
            own,
        )
        return _own(euid)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if setting != "auto":
            raise TrialUserError(f"TRIALBUS_TRIAL_USER={name}: there is no such user on this host") from None
        entry = create(name)
    if entry.pw_uid == euid:
        log.warning("TRIALBUS_TRIAL_USER=%s is this adapter's own user: trials are NOT isolated from the stack", name)
        return _own(euid)
    if euid != 0:
        raise TrialUserError(
            f"TRIALBUS_TRIAL_USER={name}: this adapter runs as {own}, not root, and cannot run trials as another user"
        )
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    log.info("trials run as user %s (uid %d), isolated from the stack's files", name, entry.pw_uid)
    return TrialUser(name, entry.pw_uid, entry.pw_gid, groups, switch=True)


def _parents(path: str) -> list[str]:
    """The folders above ``path``, nearest first (``/`` last)."""
    found = []
    while (parent := os.path.dirname(path)) != path:
        found.append(parent)
        path = parent
    return found


def _own(euid: int) -> TrialUser:
    return TrialUser(pwd.getpwuid(euid).pw_name, euid, os.getegid(), tuple(os.getgroups()), switch=False)


def create(name: str) -> pwd.struct_passwd:
    """Create the system user ``name`` (no home, no login shell, a group of its own)."""
    shell = shutil.which("nologin") or ("/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false")
    command = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    try:
        done = subprocess.run([*command, "--shell", shell, name], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TrialUserError(f"cannot create the trial user {name} with useradd: {exc}") from exc
    try:  # (another replica may have created it meanwhile: useradd then fails, and the user is there)
        entry = pwd.getpwnam(name)
    except KeyError:
        raise TrialUserError(
            f"cannot create the trial user {name}: useradd said {done.stderr.strip() or done.returncode}"
        ) from None
    log.info("created the system user %s (uid %d) to run trials as", name, entry.pw_uid)
    return entry


class TrialUsers:
    """The trial user of this adapter, and who owns what under its folders (the module's
    docstring). Until :meth:`start`, and for trials that run as the adapter's own user, the
    files are left as they are made."""

    def __init__(self, setting: str) -> None:
        """``setting``: ``TRIALBUS_TRIAL_USER``."""
        self.setting = setting
        self.user = _own(os.geteuid())  # (not switching: what start decides)

    async def start(self) -> None:
        """Find (or create) the trial user; :class:`TrialUserError` when it cannot be used."""
        self.user = await asyncio.to_thread(resolve, self.setting)

    def trial_user_for(self, request: TrialRequest) -> TrialUser:
        """The user ``request``'s trial runs as: one for every trial today. A user per team would be
        chosen here (the zygote and the warm pool, started once per adapter, then need one per user)."""
        del request  # every trial runs as the same user for now
        return self.user

    @property
    def other_uid(self) -> int | None:
        """The trial user's uid when it is not the adapter's; None when trials run as the adapter."""
        return self.user.uid if self.user.switch else None

    def check_reachable(self, path: str) -> None:
        """Raise :class:`TrialUserError` when the trial user cannot pass through every folder on the
        way to ``path`` (a data dir under a private home: ``/root/.trialbus``), so that the adapter
        fails at start with the reason, not each trial with "permission denied"."""
        if not self.user.switch:
            return
        user, here = self.user, os.path.abspath(path)
        for folder in [*reversed(_parents(here)), here]:
            found = os.stat(folder)
            if found.st_uid == user.uid:
                passes = found.st_mode & 0o100
            elif found.st_gid == user.gid or found.st_gid in user.groups:
                passes = found.st_mode & 0o010
            else:
                passes = found.st_mode & 0o001
            if not passes:
                raise TrialUserError(
                    f"trials run as user {user.name}, who cannot pass through {folder} (mode "
                    f"{stat.S_IMODE(found.st_mode):o}) to reach {here}: let it (chmod o+x {folder}), or choose "
                    "a data dir (TRIALBUS_DATA_DIR, `trialbus up --data-dir`) outside it"
                )

    def folder(self, path: str) -> None:
        """Make the adapter's folder ``path`` (and missing parents), mode 0711 when trials switch users."""
        os.makedirs(path, exist_ok=True)
        if self.user.switch:
            os.chmod(path, PASS_THROUGH)

    def share(self, path: str) -> None:
        """Let the trial user read the adapter's tree ``path`` (a code snapshot, unpacked private):
        group the trial user's, readable (and searchable) by the group; writable by no trial.
        O(files), once per snapshot and run of the adapter."""
        if not self.user.switch:
            return
        owner, gid = os.geteuid(), self.user.gid
        for folder, _dirs, files in os.walk(path):
            os.chown(folder, owner, gid, follow_symlinks=False)
            os.chmod(folder, (os.stat(folder).st_mode & 0o707) | 0o050)
            for name in files:
                item = os.path.join(folder, name)
                found = os.lstat(item)
                if stat.S_ISREG(found.st_mode):
                    os.chown(item, owner, gid, follow_symlinks=False)
                    os.chmod(item, (found.st_mode & 0o707) | 0o040 | (found.st_mode & 0o100) >> 3)

    def hand_over(self, path: str) -> None:
        """An attempt's directory, or its checkpoint directory, made by the adapter: the trial
        user's, mode 0700 (its contents keep their owner: a retry's earlier checkpoints)."""
        if self.user.switch:
            os.chown(path, self.user.uid, self.user.gid, follow_symlinks=False)
            os.chmod(path, PRIVATE)

    def take_back(self, path: str) -> None:
        """A finished attempt's directory: the adapter's again, mode 0700, so no later trial reads
        it (the files in it keep their owner; a directory that is gone is no error)."""
        if self.user.switch:
            try:
                os.chown(path, os.geteuid(), os.getegid(), follow_symlinks=False)
                os.chmod(path, PRIVATE)  # (its entry is in the adapter's folder: no trial can make it a link)
            except FileNotFoundError:
                pass
