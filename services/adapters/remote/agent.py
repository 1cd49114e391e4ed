"""Trialbus remote agent: the remote adapter's hands on one SSH machine (stdlib only).

The adapter uploads this file beside ``trial_keeper.py`` and runs it over one SSH exec
channel per machine as ``python3 -S -I agent.py <root>``. It speaks JSON lines: requests on
stdin (``{"id": 1, "op": "launch", …}``), answers on stdout (``{"id": 1, "result": …}`` or
``{"id": 1, "error": "…"}``), and events when a watched keeper exits
(``{"event": "exit", "dir": …}``), so the adapter hears of a trial's end at once.

Trials do not depend on it: each keeper is forked into its own session and survives the
agent, the SSH connection and the adapter. When the connection drops, stdin reaches EOF and
the agent exits; the adapter starts a new one when it reconnects and finds every trial
from its directory (``<root>/trials/<experiment>/<trial>-<attempt>/``), exactly as the
local adapter does on its host. Nothing here needs root or anything but ``python3`` (≥ 3.9).
"""

import json
import os
import select
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out

import agent_checkpoints  # type: ignore[import-not-found]  # noqa: E402 - shipped beside this file
import agent_host  # type: ignore[import-not-found]  # noqa: E402 - shipped beside this file
import trial_keeper  # type: ignore[import-not-found]  # noqa: E402 - shipped beside this file
import trialdir  # type: ignore[import-not-found]  # noqa: E402 - shipped beside this file
import warm_pool  # type: ignore[import-not-found]  # noqa: E402 - shipped beside this file (with trial_template.py)

STATE, SPOOL = trialdir.STATE, trialdir.SPOOL


def read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def keeper_alive(pid):
    """A keeper is a session leader (it called setsid): a live pid that leads its own
    session is our keeper, not a recycled pid; a zombie is not alive."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != b"Z" and int(fields[3]) == pid


class Agent:
    def __init__(self, root):
        self.root = os.path.abspath(os.path.expanduser(root))
        try:  # this SSH user's alone: another account on the machine (another team's) lists nothing here
            os.chmod(self.root, 0o700)
        except OSError:
            pass
        self.watched = {}  # pidfd -> (pid, trial dir)
        self.watching = set()  # pids with a pidfd
        self.out_lock = threading.Lock()
        self.buf = b""
        here = os.path.dirname(os.path.abspath(__file__))
        self.warm = warm_pool.WarmPool(
            warm_pool.Path(self.root, "templates"),
            here + "/trial_keeper.py",
            lambda line: sys.stderr.write(line + "\n"),
            shim=here + "/nni_shim",
        )
        self.forked = {}  # pid -> template key, for the keepers forked warm

    # -- protocol ---------------------------------------------------------------------------

    def send(self, message):
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self.out_lock:
            while data:
                data = data[os.write(1, data) :]

    def serve(self):
        os.makedirs(self.root + "/trials", exist_ok=True)
        self.send(
            {
                "ready": {
                    "root": self.root,
                    "pid": os.getpid(),
                    "cpus": os.cpu_count() or 1,
                    "python": sys.version.split()[0],
                    "keeper": trial_keeper.VERSION,
                }
            }
        )
        while True:
            ready = select.select([0] + list(self.watched), [], [])[0]
            for fd in ready:
                if fd != 0:
                    self.exited(fd)
            if 0 in ready:
                chunk = os.read(0, 1 << 20)
                if not chunk:
                    self.warm.close()
                    return 0  # the adapter is gone: the trials run on
                self.buf += chunk
                while b"\n" in self.buf:
                    line, self.buf = self.buf.split(b"\n", 1)
                    if line.strip():
                        self.handle(json.loads(line))

    def handle(self, request):
        op = request.get("op", "")
        method = getattr(self, "op_" + op, None)
        if method is None:
            return self.send({"id": request.get("id"), "error": "unknown op %r" % op})
        if op in ("gpus", "probe", "unpack", "clean", "checkpoint_pack", "checkpoint_unpack"):  # slow: in a thread
            threading.Thread(target=self.call, args=(method, request), daemon=True).start()
        else:
            self.call(method, request)

    def call(self, method, request):
        try:
            self.send({"id": request.get("id"), "result": method(request)})
        except Exception as exc:  # noqa: BLE001 - the adapter shows it to people
            self.send({"id": request.get("id"), "error": "%s: %s" % (type(exc).__name__, exc)})

    # -- watching keepers -------------------------------------------------------------------

    def watch(self, pid, trial_dir):
        if pid in self.watching:
            return
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return  # gone already, or an old kernel: the adapter's polls notice the end
        self.watched[fd] = (pid, trial_dir)
        self.watching.add(pid)

    def exited(self, fd):
        pid, trial_dir = self.watched.pop(fd)
        self.watching.discard(pid)
        os.close(fd)
        if pid in self.forked:
            self.warm.learn(self.forked.pop(pid), trial_dir)
        try:
            os.waitpid(pid, os.WNOHANG)  # our child (launched by this agent): reap it
        except ChildProcessError:
            pass
        self.send({"event": "exit", "dir": trial_dir})

    def trial_dir(self, request):
        return self.under("trials", request["dir"], "a trial directory")

    def under(self, folder, path, what):
        """``path``, made absolute, when it lies in ``<root>/<folder>/``; ValueError otherwise."""
        path = os.path.abspath(path)
        if not path.startswith("%s/%s/" % (self.root, folder)):
            raise ValueError("%s is not %s under %s" % (path, what, self.root))
        return path

    # -- operations -------------------------------------------------------------------------

    def op_launch(self, request):
        """Create the trial directory (the idempotency point, as on the local adapter) and
        fork its keeper; ``{"exists": true}`` when the attempt was launched before."""
        path = self.trial_dir(request)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path)
        except FileExistsError:
            return {"exists": True}
        os.mkdir(path + "/" + trialdir.META)
        for name, text in request.get("files", {}).items():  # by name, in .trialbus/
            fd = os.open("%s/%s/%s" % (path, trialdir.META, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        environ = dict(os.environb)
        environ.update((k.encode(), v.encode("utf-8", "surrogateescape")) for k, v in request["env"].items())
        environ[b"TRIALBUS_TRIAL_DIR"] = path.encode()
        forked = None
        if request.get("warm"):  # from this machine's warm template (docs/warm-start.md); a new one gets 0.5 s
            env = {os.fsdecode(k): os.fsdecode(v) for k, v in environ.items()}
            forked = self.warm.fork(env, request.get("preload", ()), wait=0.5)
        if forked:
            pid = forked[0]
            self.forked[pid] = forked[1]  # its template learns from the trial's imports at its end
        else:
            pid = trial_keeper.fork_keeper(environ)
        self.watch(pid, path)
        return {"pid": pid, "warm": pid in self.forked}

    def op_status(self, request):
        """Per trial directory: the keeper's state, whether it runs, its spool files' ages, and the
        signature of its checkpoint directory when ``checkpoints`` names it (trial dir → checkpoint dir)."""
        now, found, checkpoints = time.time(), {}, request.get("checkpoints") or {}
        for trial_dir in request["dirs"]:
            path = self.trial_dir({"dir": trial_dir})
            state = read_json(path + "/" + STATE)
            pid = (state or {}).get("keeperPid")
            alive = bool(pid) and keeper_alive(pid)
            if alive:
                self.watch(pid, path)
            spool = []
            try:
                for entry in os.scandir(path + "/" + SPOOL):
                    if entry.name.isdigit():
                        spool.append([entry.name, now - entry.stat().st_mtime])
            except FileNotFoundError:
                pass
            found[trial_dir] = {"state": state, "alive": alive, "exists": os.path.isdir(path), "spool": sorted(spool)}
            if trial_dir in checkpoints:  # (a path outside the root has none, rather than failing the read)
                checkpoint = os.path.abspath(checkpoints[trial_dir])
                inside = checkpoint.startswith(self.root + "/checkpoints/")
                found[trial_dir]["checkpoint"] = agent_checkpoints.scan(checkpoint)[0] if inside else None
        return found

    def op_checkpoint_scan(self, request):
        """A checkpoint directory's signature, and the newest attempt of its trial that ran here."""
        path = self.under("checkpoints", request["dir"], "a checkpoint directory")
        newest = self.op_find(request)
        return {"signature": agent_checkpoints.scan(path)[0], "attempt": newest and newest["attempt"]}

    def op_checkpoint_pack(self, request):
        """Pack a checkpoint directory into ``archive`` (under ``<root>/tmp/``) unless it is unchanged
        since ``since``, empty or past ``maxBytes`` (agent_checkpoints.pack)."""
        path = self.under("checkpoints", request["dir"], "a checkpoint directory")
        archive = self.under("tmp", request["archive"], "a scratch file")
        return agent_checkpoints.pack(path, archive, request["maxBytes"], request.get("since"))

    def op_checkpoint_unpack(self, request):
        """Replace a checkpoint directory by the uploaded ``archive``, checked (agent_checkpoints.unpack)."""
        path = self.under("checkpoints", request["dir"], "a checkpoint directory")
        archive = self.under("tmp", request["archive"], "a scratch file")
        return {"signature": agent_checkpoints.unpack(archive, path, request["maxBytes"])}

    def op_signal(self, request):
        """Signal the keeper (it stops the trial's group); ``group``: the trial's group too."""
        path = self.trial_dir(request)
        state = read_json(path + "/" + STATE) or {}
        sent = False
        if state.get("keeperPid") and keeper_alive(state["keeperPid"]):
            os.kill(state["keeperPid"], request["signal"])
            sent = True
        if request.get("group") and state.get("pgid") and "exitCode" not in state:
            try:
                os.killpg(state["pgid"], request["signal"])
                sent = True
            except (ProcessLookupError, PermissionError):
                pass
        return {"sent": sent}

    def op_spool(self, request):
        """The records a keeper could not deliver, per spool file in order, once one of them is
        older than ``minAge``."""
        path, now, files = self.trial_dir(request), time.time(), []
        try:
            entries = sorted(os.scandir(path + "/" + SPOOL), key=lambda e: e.name)
        except FileNotFoundError:
            entries = []
        entries = [e for e in entries if e.name.isdigit()]
        try:  # all of them, in order, once any is stuck (the keeper rewrites the one it retries)
            if not any(now - e.stat().st_mtime >= request.get("minAge", 0) for e in entries):
                entries = []
        except FileNotFoundError:
            entries = []  # the keeper is delivering: not stuck
        for entry in entries:
            try:
                with open(entry.path, "rb") as f:
                    files.append([entry.name, trial_keeper.parse_frames(f.read())[0]])
            except FileNotFoundError:
                continue  # the keeper delivered it meanwhile
        token = None
        if files:
            with open(path + "/" + trialdir.TOKEN) as f:
                token = f.read()
        return {"files": files, "token": token}

    def op_unspool(self, request):
        path = self.trial_dir(request)
        for name in request["names"]:
            if name.isdigit():
                try:
                    os.unlink("%s/%s/%s" % (path, SPOOL, name))
                except FileNotFoundError:
                    pass
        return {}

    def op_list(self, request):
        """Every trial directory not yet reported: what a restarted adapter adopts."""
        return [
            {
                "experiment": experiment,
                "trial": trial,
                "attempt": attempt,
                "dir": path,
                "state": read_json(path + "/" + STATE),
                "mtime": os.stat(path).st_mtime,
                "gpus": read_json(path + "/" + trialdir.GPUS),
            }
            for experiment, trial, attempt, path in trialdir.unreported(self.root + "/trials")
        ]

    def op_find(self, request):
        """The directory of a trial's attempt, the newest unless ``attempt`` names one (for its log
        after the adapter restarted)."""
        experiment, trial, wanted = request["experiment"], request["trial"], request.get("attempt")
        if "/" in experiment + trial or experiment.startswith("."):
            return None
        found = trialdir.newest("%s/trials/%s" % (self.root, experiment), trial, wanted)
        return found and {"attempt": found[0], "dir": found[1]}

    def op_report(self, request):
        path = self.trial_dir(request)
        if os.path.isdir(path):
            trialdir.mark_reported(path)
        return {}

    def op_tail(self, request):
        path, size, found = self.trial_dir(request), request.get("max", 65536), {}
        for name in ("stdout", "stderr", "trial.log"):
            try:
                with open(path + "/" + name, "rb") as f:
                    f.seek(max(0, f.seek(0, 2) - size))
                    found[name] = f.read(size).decode("utf-8", "replace")
            except FileNotFoundError:
                continue
        return found

    def op_gpus(self, request):
        """``nvidia-smi -q -x`` as text, and the session of each process it lists (agent_host.gpus)."""
        return agent_host.gpus(request.get("nvidiaSmi"))

    def op_probe(self, request):
        """The ``python3`` a trial gets with ``pythonPath`` first on PATH (agent_host.probe)."""
        return agent_host.probe(request.get("pythonPath"))

    def op_unpack(self, request):
        """Unpack an uploaded code snapshot (tar.gz) into ``dest`` atomically, refusing
        members that would land outside it; the archive is removed."""
        import shutil
        import tarfile
        import tempfile

        archive, dest = os.path.abspath(request["archive"]), os.path.abspath(request["dest"])
        try:
            if os.path.isdir(dest):
                return {}
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = tempfile.mkdtemp(prefix="." + os.path.basename(dest) + "-", dir=os.path.dirname(dest))
            try:
                with tarfile.open(archive, "r:gz") as tar:
                    for member in tar.getmembers():
                        name = member.name
                        if name.startswith("/") or ".." in name.split("/") or not (member.isfile() or member.isdir()):
                            raise ValueError("code snapshot member %r is not a plain file inside it" % name)
                    if hasattr(tarfile, "data_filter"):
                        tar.extractall(tmp, filter="data")
                    else:  # Python without extraction filters (before 3.9.17): the members are checked above
                        tar.extractall(tmp)
                try:
                    os.rename(tmp, dest)
                except OSError:
                    if not os.path.isdir(dest):
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            try:
                os.unlink(archive)
            except FileNotFoundError:
                pass
        return {}

    def op_clean(self, request):
        """Remove trial directories reported more than ``retention`` seconds ago, checkpoint
        directories unchanged as long but those of trials still running here, and scratch files
        (checkpoint archives a dropped connection left) older than an hour."""
        deadline = time.time() - request["retention"]
        for entry in os.scandir(self.root + "/tmp") if os.path.isdir(self.root + "/tmp") else ():
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < time.time() - 3600:
                    os.unlink(entry.path)
            except OSError:
                continue
        removed, running = trialdir.remove_expired(self.root + "/trials", deadline)  # running: their checkpoints stay
        stale = agent_checkpoints.remove_stale(self.root + "/checkpoints", deadline, running)
        return {"removed": removed, "checkpoints": stale}


if __name__ == "__main__":
    sys.exit(Agent(sys.argv[1] if len(sys.argv) > 1 else "~/.trialbus").serve())
