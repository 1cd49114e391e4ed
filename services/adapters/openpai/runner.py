"""The reuse-mode environment runner of the openpai adapter: runs the trials handed to one
OpenPAI job, one after another, through the trial keeper. Stdlib only (Python 3.9+): it is
shipped on the share as ``openpai_runner.py`` beside ``trial_keeper.py``, and started by each
task of an environment job::

    python3 -S -I <share>/trialbus/bin/<hash>/openpai_runner.py --env <env dir> --task <env dir>/<role>-<index>
        --command <the role's commands, a private temporary file> [--reports] [--poll 0.1] [--orphan 600]

The channel is the share, so it works where the cluster cannot reach the adapter's host:

- ``<env dir>/tickets/<n>-<trial>-<attempt>``: a trial handed to this environment (the
  adapter writes it atomically; its text is the trial's folder as the container sees it).
  Every task of the environment runs every ticket, in name order, each in
  ``<trial folder>/<role>-<index>/``, with the trial's ``report.env`` settings in the first
  task of the reporting role (``--reports``) and ``quiet.env`` in the others.
- ``<trial folder>/.trialbus/cancel``: stop the trial (SIGTERM to its keeper, which stops
  the trial's process group), or skip it if it has not started.
- ``<trial folder>/<role>-<index>/.trialbus/environment-stopped``: the runner itself was
  told to stop (the job is being stopped) while it ran this trial.
- ``<env dir>/alive``: touched by the adapter. When it has not changed for ``--orphan``
  seconds and no trial runs, the runner exits 0 (the job ends) — an adapter that never
  comes back leaves no job behind. The adapter stops idle environments itself.

Warm start (docs/warm-start.md): where the trial's settings ask for it (``TRIALBUS_WARM``) and
the role's command is one line of the shape ``python X.py …`` / ``python -m mod …``, the trial
forks from the task's warm template (``warm_pool.py``, shipped beside this file, as are
``trial_template.py`` and ``warm_trial.py``), kept for the life of the environment and learning the trials' imports;
any other command runs as before, through ``sh``.

A task folder that exists when its ticket comes up again (the job or the task was retried by
OpenPAI after the runner had begun the trial) gets an error in its ``state.json`` instead of a
second run: a trial never runs twice. The trial folder's paths are ``trialdir.py``'s, shipped beside
this file.
"""

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out

import trialdir  # type: ignore[import-not-found]  # noqa: E402 - shipped beside this file (services/adapters/trialdir.py)


def parse(argv):
    parser = argparse.ArgumentParser(prog="openpai_runner.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="the environment's folder on the share")
    parser.add_argument("--task", required=True, help="this task's folder in it (<role>-<index>)")
    parser.add_argument("--command", required=True, help="the script of the role's commands, run for each trial")
    parser.add_argument("--reports", action="store_true", help="this task's role reports the trials' metrics")
    parser.add_argument("--poll", type=float, default=0.1, help="seconds between two looks at the tickets")
    parser.add_argument("--orphan", type=float, default=600.0, help="seconds without word from the adapter")
    return parser.parse_args(argv)


def read_json(path):
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read() or b"{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write_json(path, value):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.rename(tmp, path)


def ended(state):
    return state.get("exitCode") is not None or bool(state.get("done")) or bool(state.get("error"))


class Runner:
    def __init__(self, args, keeper):
        self.env, self.task, self.command = args.env.rstrip("/"), args.task.rstrip("/"), args.command
        self.name = os.path.basename(self.task)
        self.settings = "report.env" if args.reports and self.name.endswith("-0") else "quiet.env"
        self.poll, self.orphan = args.poll, args.orphan
        self.keeper = keeper
        self.warm = None  # the task's WarmPool, made for the first trial that can use it
        self.seen = set()
        self.child = 0
        self.current = ""  # the running trial's task folder
        self.stopping = False
        self.alive = (None, time.monotonic())  # (mtime of "alive", when it last changed)
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

    def on_signal(self, signum, frame):
        """The job is being stopped: stop the trial (its keeper stops its process group), and
        say so beside it, so that the adapter tells this from the trial's own end."""
        self.stopping = True
        if self.child:
            try:
                open(self.current + "/" + trialdir.ENVIRONMENT_STOPPED, "ab").close()
            except OSError:
                pass
            try:
                os.kill(self.child, signal.SIGTERM)
            except OSError:
                pass

    def say(self, message):
        print("trialbus runner %s: %s" % (self.name, message), flush=True)

    def run(self):
        self.say("waiting for trials in %s/tickets" % self.env)
        while not self.stopping:
            ticket = self.next_ticket()
            if ticket is not None:
                self.run_trial(*ticket)
            elif self.orphaned():
                self.say("no word from the adapter for %.0fs: leaving" % self.orphan)
                return 0
            else:
                time.sleep(self.poll)
        return 128 + signal.SIGTERM

    def next_ticket(self):
        try:
            names = sorted(os.listdir(self.env + "/tickets"))
        except OSError:
            return None
        for name in names:
            if name.startswith(".") or name in self.seen:
                continue
            self.seen.add(name)
            try:
                with open(self.env + "/tickets/" + name, "rb") as f:
                    trial_dir = f.read().decode("utf-8", "surrogateescape").strip()
            except OSError:  # released meanwhile
                continue
            return name, trial_dir
        return None

    def orphaned(self):
        try:
            mtime = os.stat(self.env + "/alive").st_mtime
        except OSError:
            mtime = None
        now = time.monotonic()
        if mtime != self.alive[0]:
            self.alive = (mtime, now)
            return False
        return now - self.alive[1] > self.orphan

    def run_trial(self, ticket, trial_dir):
        task = trial_dir + "/" + self.name
        state_path = task + "/" + trialdir.STATE
        cancel = trial_dir + "/" + trialdir.CANCEL
        try:
            os.mkdir(task)  # the claim: a trial never runs twice in one task
        except FileExistsError:
            state = read_json(state_path)
            if not ended(state):
                os.makedirs(task + "/" + trialdir.META, exist_ok=True)
                state.update(
                    error="the trial was interrupted: its OpenPAI environment restarted (a job or task "
                    "retry) while it ran",
                    endTime=time.time(),
                )
                write_json(state_path, state)
            return
        except OSError as exc:  # the trial folder is gone: nothing to run
            self.say("ticket %s: %s" % (ticket, exc))
            return
        os.mkdir(task + "/" + trialdir.META)
        if os.path.exists(cancel):
            write_json(state_path, {"done": True, "canceled": True, "endTime": time.time()})
            return
        environ = self.keeper.read_settings(trial_dir + "/" + trialdir.META + "/" + self.settings)
        environ.update(os.environb)
        environ[b"TRIALBUS_TRIAL_DIR"] = os.fsencode(task)
        environ[b"TRIALBUS_TRIAL_COMMAND"] = os.fsencode("sh %s" % self.command)
        self.current = task
        template, self.child = self.fork_warm(environ)
        if not self.child:
            self.child = self.keeper.fork_keeper(environ)
        self.say("trial %s: started%s" % (ticket, " (warm)" if template else ""))
        stopped = False
        while self.running(template):
            if not stopped and (self.stopping or os.path.exists(cancel)):
                os.kill(self.child, signal.SIGTERM)
                stopped = True
            time.sleep(min(self.poll, 0.05))
        self.child = 0
        if template:
            self.warm.learn(template, task)
        self.say("trial %s: ended" % ticket)

    def running(self, template):
        """Whether the trial's keeper runs: our child (cold), or the template's (warm, reaped by
        the kernel there: gone once it ends)."""
        try:
            if template:
                os.kill(self.child, 0)
                return True
            return os.waitpid(self.child, os.WNOHANG)[0] == 0
        except (ChildProcessError, ProcessLookupError):
            return False

    def fork_warm(self, environ):
        """(template key, keeper pid) of the trial forked warm, or (None, 0) to start it cold."""
        line = self.python_line()
        if environ.get(b"TRIALBUS_WARM") != b"1" or line is None:
            return None, 0
        environ[b"TRIALBUS_TRIAL_COMMAND"] = os.fsencode(line)  # no shell needed for one plain command
        # Shipped beside this file (services/trial_keeper/warm_pool.py): no module of that name here.
        import warm_pool  # type: ignore[import-not-found]

        if self.warm is None:
            here = os.path.dirname(os.path.abspath(__file__))
            self.warm = warm_pool.WarmPool(
                warm_pool.Path(self.task, "templates"), here + "/trial_keeper.py", self.say, shim=here + "/nni_shim"
            )
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in environ.items()}
        preload = [name for name in env.get("TRIALBUS_WARM_PRELOAD", "").split(",") if name]
        forked = self.warm.fork(env, preload, wait=5)
        return (forked[1], forked[0]) if forked else (None, 0)

    def python_line(self):
        """The role's command when it is a single line (comments and blank lines aside)."""
        try:
            with open(self.command, encoding="utf-8") as f:
                lines = [line.strip() for line in f if line.strip() and not line.strip().startswith("#")]
        except OSError:
            return None
        return lines[0] if len(lines) == 1 else None


def main(argv=None):
    args = parse(argv)
    # Shipped beside this file (services/trial_keeper/trial_keeper.py): no module of that name here.
    import trial_keeper  # type: ignore[import-not-found]

    return Runner(args, trial_keeper).run()


if __name__ == "__main__":
    sys.exit(main())
