"""Starting trial keepers on this host: their environment, the zygotes, the warm templates.

A keeper starts one of three ways, cheapest first: forked from a warm template that has
imported the trial's modules (``warm_start``; docs/warm-start.md), forked from its user's
keeper zygote (``keeper_zygote``, ~1 ms of CPU; :mod:`.zygotes`), or as a new interpreter
(~13 ms). The keeper is byte-compiled once at start, with the interpreter that runs it. A
template's keepers are kept for trial after trial and say each trial's end on the socket of
:mod:`.ends`.

The environment every keeper gets is ours minus ``TRIALBUS_*`` (never pass our NATS secrets
on), plus what the keeper needs (gateway, grace, the NNI shim); a launch adds the trial's. The
zygote's own environment is ours minus ``TRIALBUS_*`` too: its keepers keep it. Every one of
these processes runs as the trial's user (:mod:`.users`; one per team under ``auto`` as root): the
keeper and the zygote become it as they start (``TRIALBUS_RUN_AS``), a template is started as it.
There is a zygote per user, and the warm pool keys its templates by ``TRIALBUS_RUN_AS`` among the
rest: a keeper is never forked from another user's process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping

from contracts import TrialRequest
from services.adapters.local_gpu import client
from services.adapters.local_gpu.ends import KeeperEnds
from services.adapters.local_gpu.settings import LocalGpuSettings
from services.adapters.local_gpu.users import TrialUser, TrialUsers
from services.adapters.local_gpu.zygotes import Zygotes
from services.common.tasks import cancel_and_wait
from services.trial_keeper.warm_pool import WarmPool

TEMPLATE_SWEEP = 1.0  # seconds between two sweeps of the warm templates (reaped, idle ones ended)

log = logging.getLogger(__name__)


class KeeperSpawner:
    """Starts the keepers of this host's trials (the module's docstring)."""

    def __init__(
        self,
        settings: LocalGpuSettings,
        keeper_path: str,
        shim_path: str,
        on_kept_end: Callable[[str], None],
        users: TrialUsers,
    ) -> None:
        """``on_kept_end(trial_dir)``: a kept keeper said its trial ended; ``users``: who the
        keepers run as (started before this part)."""
        self.settings, self.shim_path, self.on_kept_end, self.users = settings, shim_path, on_kept_end, users
        self.keeper_source = self.keeper_path = keeper_path  # the path becomes the .pyc's at start
        #: What every keeper gets (set at start); a launch adds the trial's variables.
        self.env: dict[str, str] = {}
        self.zygotes: Zygotes | None = None
        self.warm: WarmPool | None = None
        self.ends: KeeperEnds | None = None  # where kept keepers say their trial ended
        self._sweeps: asyncio.Task | None = None

    async def start(self) -> None:
        settings, work_dir = self.settings, self.settings.work_dir
        assert work_dir is not None  # the settings' validator fills in its default
        self.keeper_path = await asyncio.to_thread(
            client.compile_keeper, settings.keeper_python, self.keeper_source, work_dir / "trial_keeper.pyc"
        )
        # The trial sees the keeper's environment minus TRIALBUS_*: never pass ours (NATS secrets) on.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
        if settings.keeper_zygote:
            self.zygotes = Zygotes(settings.keeper_python, self.keeper_path, work_dir / "zygote.log", dict(env))
            if not self.users.per_team:  # one user for every trial: its zygote now, as before teams
                self.zygotes.start(self.users.user)
        # After the zygote started: keepers forked from it, and their trials, keep the host's limit
        # (those of a zygote started later, as those started cold, get the raised one).
        before, now, enough = client.raise_fd_limit(settings.max_trials)
        if now != before:
            log.info(
                "raised the soft limit of open files from %d to %d (max_trials %d)", before, now, settings.max_trials
            )
        if not enough:
            log.warning(
                "open files are limited to %d: past about %d running trials, their ends are noticed at the "
                "next poll, not at once (raise the hard limit: ulimit -Hn)",
                now,
                now - client.FD_HEADROOM,
            )
        env.update(
            TRIALBUS_GATEWAY_URL=settings.gateway_url,
            TRIALBUS_KILL_GRACE=str(settings.kill_grace),
            TRIALBUS_FLUSH_TIMEOUT=str(settings.flush_timeout),
        )
        shim = settings.nni_shim != "never"
        if shim:
            env["TRIALBUS_PYTHONPATH_PREPEND"] = self.shim_path
        if settings.warm_start:
            ends = KeeperEnds(self.on_kept_end)
            try:  # a template's keepers then keep trial after trial (Linux: the abstract namespace)
                ends.start()
                self.ends, env["TRIALBUS_DONE_SOCKET"] = ends, ends.address
            except OSError as exc:
                log.warning("each warm trial gets a keeper of its own: no socket for their notices (%s)", exc)
            self.users.folder(str(work_dir / "templates"))
            self.warm = WarmPool(
                work_dir / "templates",
                self.keeper_source,
                log.warning,
                shim=self.shim_path if shim else None,
                max_templates=settings.warm_templates,
                idle=settings.warm_idle,
                reuse_keepers=self.ends is not None,
            )
        log.info(
            "work dir %s; nni shim %s; warm start %s", work_dir, "on" if shim else "off", "on" if self.warm else "off"
        )
        self.env = env
        if self.warm is not None:
            self._sweeps = asyncio.create_task(self._sweep_templates(self.warm))

    async def _sweep_templates(self, warm: WarmPool) -> None:
        """Reap the templates that exited and end those idle for ``warm_idle``, every
        ``TEMPLATE_SWEEP`` seconds, whether trials start or not: a template the pool closed (the
        bare one a fuller one replaced, as an experiment's first trial starts) exits once its
        keepers' trials did, and stays a zombie child of this process until it is waited for.
        O(templates) a sweep."""
        while True:
            await asyncio.sleep(TEMPLATE_SWEEP)
            try:
                warm.sweep()
            except Exception:  # noqa: BLE001 - the next sweep tries again; trials start cold if need be
                log.exception("sweeping the warm templates failed")

    async def stop(self) -> None:
        """Stop the sweeps, the zygote, the templates and the notices; the keepers run on."""
        if self._sweeps is not None:
            await cancel_and_wait([self._sweeps])
        if self.zygotes is not None:
            self.zygotes.close()
        if self.warm is not None:
            self.warm.close()
        if self.ends is not None:
            self.ends.close()

    @property
    def zygote(self) -> client.KeeperZygote | None:
        """The zygote of trials without a team (of every trial under one trial user), if it runs."""
        found = self.zygotes.running.get(self.users.user.run_as()) if self.zygotes is not None else None
        return found[0] if found is not None else None

    def prepare(self, user: TrialUser) -> None:
        """Start ``user``'s zygote if it has none (its first trial here), so that it starts while
        the launch goes on."""
        if self.zygotes is not None:
            self.zygotes.start(user)

    def env_for(self, user: TrialUser) -> dict[str, str]:
        """What every keeper of ``user``'s trials gets (a launch adds the trial's variables)."""
        return dict(self.env, TRIALBUS_RUN_AS=user.run_as()) if user.switch else dict(self.env)

    async def warm_wait(self, request: TrialRequest, code_dir: str | None, user: TrialUser) -> None:
        """Wait while the trial's warm template is still starting (an experiment's first, ~50 ms
        bare, seconds with the script's imports read ahead; a fuller one learned from the trials
        that brings a package the ready one lacks): as long as it makes progress, since a trial
        that started cold beside it would pay the same imports on the same cores. The launch
        then forks from what is ready, or starts the trial cold: when the template died, used no
        CPU for ``warm_stall`` seconds (an import that hangs), or after ``warm_wait`` seconds."""
        if self.warm is None or not request.warm_start:
            return
        env = dict(self.env_for(user), TRIALBUS_EXPERIMENT_ID=request.experiment_id)
        if code_dir is not None:
            env["TRIALBUS_CODE_DIR"] = code_dir
        deadline, stall = time.monotonic() + self.settings.warm_wait, self.settings.warm_stall
        while time.monotonic() < deadline:
            starting = self.warm.waiting(request.trial_command, env, request.warm_preload)
            if starting is None or starting.stalled(stall):
                return
            await asyncio.sleep(0.005)

    def fork(self, env: Mapping[str, str], request: TrialRequest) -> tuple[int, str] | None:
        """A keeper forked from the trial's warm template: ``(pid, template key)``; None when the
        trial starts cold (no template ready, ``warmStart: false``, warm start off here)."""
        return self.warm.fork(env, request.warm_preload) if self.warm and request.warm_start else None

    def spawn(self, env: Mapping[str, str], trial_dir: str, user: TrialUser) -> int:
        """A keeper started cold in ``trial_dir`` as ``user`` (from its zygote when there is one);
        its pid. Raises OSError when it cannot be started."""
        if self.zygotes is not None and (pid := self.zygotes.spawn(env, user)) is not None:
            return pid
        return client.spawn_keeper(self.settings.keeper_python, self.keeper_path, env, trial_dir)

    def learn(self, template: str, trial_dir: str) -> None:
        """A trial forked from ``template`` ended: its template learns the modules it imported."""
        if self.warm is not None:
            self.warm.learn(template, trial_dir)
