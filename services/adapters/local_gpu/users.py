"""The Unix users local trials run as, and the files each may touch (docs/security.md).

A trial runs user code: the keeper that starts it, the keeper zygote and the warm templates (which
import the trial's modules) all run as a *trial user*, never as the adapter's own user, so no
trial reads the stack's credentials (``<data>/client.json``, ``api-token``…: mode 0600), the
services' environments (``/proc/<pid>/environ`` of another user), finished trials' files, or the
running trials of another team. ``TRIALBUS_TRIAL_USER`` chooses (:func:`choose`):

- ``auto`` (default), adapter running as root: a system user per team, :func:`team_user_name`
  (``trialbus-t-<team>``), created on the team's first trial here; :data:`DEFAULT_USER` for
  experiments without a team (made before teams). Each is created with ``useradd --system`` (no
  home, no login shell, a group of its own) and runs with the shared group :data:`SHARED_GROUP`
  beside its own groups, through which it reads code snapshots (:meth:`TrialUsers.share`); a
  team's user also with :data:`DEFAULT_USER`'s supplementary groups (``render``…).
  Where a team's user cannot be created, its trials run as :data:`DEFAULT_USER` (logged);
- ``auto``, adapter not root: it cannot switch users, so its trials run as itself, *not
  isolated*, which it logs once at start;
- a user name: that user for every team; the start fails when it does not exist, or the adapter
  (not root) cannot switch to it. The adapter's own user turns isolation off on purpose.

Switching: the adapter starts keepers as root with ``TRIALBUS_RUN_AS=<uid>:<gid>:<groups>`` (the
trial's user's), and the keeper (or a zygote, before it forks any) becomes that user before it
reads a setting or runs a trial (``trial_keeper.run_as``); a template is started as that user
(``subprocess``'s ``user``). There is a zygote per user and the warm pool keys templates by user
(:mod:`.keepers`): a trial never forks from another user's process.

Files (:class:`TrialUsers`): the adapter's folders (``trials/``, each experiment's, ``code/``,
``templates/``, the checkpoint root and its experiments') belong to the adapter, mode 0711: trial
users pass through them to their own, and list none. An attempt's directory and its checkpoint
directory are handed to the trial's user at launch (mode 0700) and the attempt's directory is
taken back once the attempt's end is published: a later trial reads no finished trial's files,
and a team's trial none of another team's. Trials of one team run as one user and are not
isolated from each other; the same holds for every trial under a named ``TRIALBUS_TRIAL_USER``.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass

from contracts import TrialRequest
from contracts.people import NAME

#: The user an adapter running as root runs trials without a team as, under ``TRIALBUS_TRIAL_USER=auto``.
DEFAULT_USER = "trialbus-trial"
#: A team's user is this and the team's name (:func:`team_user_name`).
TEAM_PREFIX = "trialbus-t-"
#: The group every trial user runs with, under ``auto`` as root: it reads the code snapshots.
SHARED_GROUP = "trialbus-trials"
#: useradd's longest user name.
NAME_MAX = 32
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


def team_user_name(team: str) -> str:
    """The user a team's trials run as under ``auto``: ``trialbus-t-<team>`` for a team of up to 20
    characters; a longer one (names go up to 32) is cut to its first 12 and the first 8 hex digits
    of its name's SHA-256 (``trialbus-t-<12>-<8>``, 32 characters, :data:`NAME_MAX`). The two forms
    differ in length (at most 31, exactly 32), so a short name never meets a long one's."""
    if len(TEAM_PREFIX) + len(team) < NAME_MAX:
        return TEAM_PREFIX + team
    return f"{TEAM_PREFIX}{team[:12]}-{hashlib.sha256(team.encode()).hexdigest()[:8]}"


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


def create(name: str, groups: tuple[str, ...] = ()) -> pwd.struct_passwd:
    """Create the system user ``name`` (no home, no login shell, a group of its own, in ``groups``)."""
    shell = shutil.which("nologin") or ("/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false")
    command = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    if groups:
        command += ["--groups", ",".join(groups)]
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


def shared_group() -> int:
    """The gid of :data:`SHARED_GROUP`, created when missing (``groupadd --system``; another replica
    may create it meanwhile). Raises :class:`TrialUserError` when it cannot be."""
    with contextlib.suppress(KeyError):
        return grp.getgrnam(SHARED_GROUP).gr_gid
    try:
        done = subprocess.run(["groupadd", "--system", SHARED_GROUP], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TrialUserError(f"cannot create the group {SHARED_GROUP} with groupadd: {exc}") from exc
    try:
        gid = grp.getgrnam(SHARED_GROUP).gr_gid
    except KeyError:
        raise TrialUserError(
            f"cannot create the group {SHARED_GROUP}: groupadd said {done.stderr.strip() or done.returncode}"
        ) from None
    log.info("created the system group %s (gid %d) every trial user runs with", SHARED_GROUP, gid)
    return gid


def team_user(team: str, groups: tuple[int, ...]) -> TrialUser:
    """The user of ``team``'s trials (:func:`team_user_name`), created when missing; it runs with
    ``groups`` (:data:`SHARED_GROUP`'s gid, and :data:`DEFAULT_USER`'s supplementary groups)
    beside its own. Raises :class:`TrialUserError` when it cannot be created or is no
    unprivileged user (root, or the adapter's own)."""
    if not NAME.match(team):
        raise TrialUserError(f"{team!r} is no team name")
    name = team_user_name(team)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = create(name, (SHARED_GROUP,))
    if entry.pw_uid in (0, os.geteuid()):
        raise TrialUserError(f"the user {name} of team {team} is uid {entry.pw_uid}: no user to run trials as")
    return _with_groups(name, entry, groups)


def _with_groups(name: str, entry: pwd.struct_passwd, extra: tuple[int, ...]) -> TrialUser:
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    return TrialUser(name, entry.pw_uid, entry.pw_gid, (*groups, *(g for g in extra if g not in groups)), switch=True)


class TrialUsers:
    """The trial users of this adapter, and who owns what under its folders (the module's
    docstring). Until :meth:`start`, and for trials that run as the adapter's own user, the
    files are left as they are made."""

    def __init__(self, setting: str) -> None:
        """``setting``: ``TRIALBUS_TRIAL_USER``."""
        self.setting = setting
        #: Who trials without a team run as (every trial, but under ``auto`` as root).
        self.user = _own(os.geteuid())  # (not switching: what start decides)
        #: :data:`SHARED_GROUP`'s gid when each team has its user (``auto`` as root); else None.
        self.group: int | None = None
        self._teams: dict[str, asyncio.Future[TrialUser]] = {}  # team → its user (found or being made)

    async def start(self) -> None:
        """Find (or create) the trial user, and the shared group under ``auto`` as root;
        :class:`TrialUserError` when they cannot be used."""
        self.user = await asyncio.to_thread(resolve, self.setting)
        if self.setting == "auto" and self.user.switch:
            self.group = await asyncio.to_thread(shared_group)
            entry = pwd.getpwuid(self.user.uid)
            self.user = _with_groups(self.user.name, entry, (self.group,))
            log.info("each team's trials run as a user of its own (%s<team>)", TEAM_PREFIX)

    @property
    def per_team(self) -> bool:
        """Whether each team's trials run as a user of their own."""
        return self.group is not None

    async def trial_user_for(self, request: TrialRequest) -> TrialUser:
        """The user ``request``'s trial runs as: its team's under ``auto`` as root (created on the
        team's first trial, in a thread; once, however many launches wait for it), else the one
        trial user. A team whose user cannot be made runs as :data:`DEFAULT_USER` (logged once)."""
        if self.group is None or request.team is None:
            return self.user
        found = self._teams.get(request.team)
        if found is None:
            found = self._teams[request.team] = asyncio.ensure_future(self._make(request.team))
        return await asyncio.shield(found)

    async def _make(self, team: str) -> TrialUser:
        began = time.monotonic()
        # (what an admin gave trialbus-trial, e.g. ``render`` for GPUs behind a group, and the shared
        # group; never its own group: that is the trials' without a team)
        groups = tuple(g for g in self.user.groups if g != self.user.gid)
        try:
            user = await asyncio.to_thread(team_user, team, groups)
        except (TrialUserError, OSError) as exc:  # (kept: a team's launches never all fail on it)
            log.error("team %s's trials run as %s, beside other teams' trials: %s", team, self.user.name, exc)
            return self.user
        took = (time.monotonic() - began) * 1000
        log.info("team %s's trials run as user %s (uid %d; found in %.0f ms)", team, user.name, user.uid, took)
        return user

    def uid_of(self, trial_dir: str) -> int | None:
        """The uid the trial of ``trial_dir`` runs as, when not the adapter's: who the adapter handed
        the directory to (only root changes an owner); the trial user's when it is the adapter's
        own again (taken back) or gone. None when trials run as the adapter."""
        if not self.user.switch:
            return None
        with contextlib.suppress(OSError):
            owner = os.lstat(trial_dir).st_uid
            if owner != os.geteuid():
                return owner
        return self.user.uid

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
        """Let the trial users read the adapter's tree ``path`` (a code snapshot, unpacked private):
        group :data:`SHARED_GROUP` (the trial user's under a named user), readable (and
        searchable) by the group; writable by no trial. O(files), once per snapshot and run of
        the adapter."""
        if not self.user.switch:
            return
        owner, gid = os.geteuid(), self.user.gid if self.group is None else self.group
        for folder, _dirs, files in os.walk(path):
            os.chown(folder, owner, gid, follow_symlinks=False)
            os.chmod(folder, (os.stat(folder).st_mode & 0o707) | 0o050)
            for name in files:
                item = os.path.join(folder, name)
                found = os.lstat(item)
                if stat.S_ISREG(found.st_mode):
                    os.chown(item, owner, gid, follow_symlinks=False)
                    os.chmod(item, (found.st_mode & 0o707) | 0o040 | (found.st_mode & 0o100) >> 3)

    def hand_over(self, path: str, user: TrialUser) -> None:
        """An attempt's directory, or its checkpoint directory, made by the adapter: ``user``'s
        (the trial's, :meth:`trial_user_for`), mode 0700 (its contents keep their owner: a retry's
        earlier checkpoints)."""
        if user.switch:
            os.chown(path, user.uid, user.gid, follow_symlinks=False)
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
