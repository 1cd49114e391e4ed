"""Trialbus trial keeper: runs one trial and relays its NNI metrics to the metrics gateway.

Adapters ship this one stdlib-only file next to the trial and start it as
``python3 -S -I trial_keeper.py`` with ``TRIALBUS_*`` variables (docs/internals.md §1). It
writes ``parameter.cfg``; runs the command in a new session with NNI's environment (a
plain ``program arg…`` directly, anything a shell must read with ``/bin/sh -c``); tees
stdout to ``stdout`` (stderr goes straight to ``stderr``) picking up ``NNISDK_MEb'…'``
lines; tails ``.nni/metrics`` (``ME%06d`` frames); POSTs the records to the gateway in
batches (the first request announces the keeper's version: a hello without records once
the trial has run 1 s without reporting, so a version mismatch shows at once), retrying
with back-off and spooling to ``.trialbus/spool/`` while it is unreachable
(§2); and records the outcome in ``.trialbus/state.json`` (atomically) and ``.nni/state``.

Guarantees: records reach the gateway in the order the trial wrote them (per channel), at
least once while the keeper lives (the gateway dedupes by ``<trial>:<type>:<sequence>``);
nothing in the trial's process group outlives its main process; ``state.json`` ends with
``done: true`` unless the keeper itself is SIGKILLed. Exit status: the trial's exit code
(128 + n for signal n, as shells report it); 2 for a bad configuration; 1 if the keeper failed.

Speed: this starts once per trial, so its start-up is per-trial CPU. Python compiles a
script on every run (~15 µs a line: keep this file short). It imports builtin modules only
(``posix``, not ``os``, which costs ~2 ms; no ``json``, ``re``, ``subprocess``, ``socket``,
``signal``); ``_socket``, ``fcntl`` and ``select`` are shared libraries every keeper uses, loaded
at import so that keepers forked from the zygote or a trial template share them (loaded in each
keeper, they cost ~240 KiB of its own memory). HTTP and JSON are written by hand; heavier
modules load on rare paths (errors, https).
"""

import _signal  # type: ignore[import-not-found]  # no stub in typeshed for signal's C module
import _socket
import fcntl
import posix
import sys
import time
from select import select

VERSION = "0.1.0"  # must equal trialbus.__version__ (a test checks; the keeper cannot import it)

MARKER = b"NNISDK_MEb'"  # the stdout channel: NNISDK_MEb'<json>' on a line of its own
MAX_LINE = 900_000  # bytes: a longer stdout line is no record (NNI's SDK caps them at 999,999)
MAX_BATCH, MAX_BATCH_BYTES = 500, 1 << 20  # per POST (the gateway's defaults: 5000, 4 MiB)
TICK = 0.05  # seconds: the shortest gap between POSTs, and how often a reporting trial's file is read
TICK_MAX = 0.4  # seconds: a quiet trial's file is read ever less often, down to this (no wake-ups to spare)
#: Seconds a quiet trial's keeper sleeps once the kernel will wake it at the trial's next write in
#: ``.nni`` (Linux dnotify: ``watch_metrics``) and nothing else is due: 0.2 wake-ups/s, not 2.5.
QUIET_TICK = 5.0
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0
HELLO_AFTER = 1.0  # seconds: a trial that reported nothing by then gets a hello (version check)
DRAIN_AFTER_EXIT = 1.0  # seconds stdout is still read after the trial exited (escaped holders)
#: Seconds after a stop signal during which another one is the same stop (one SIGTERM to the
#: keeper's group and one passed on by its task's shell, in a container), not a second stop (SIGKILL now).
SAME_STOP = 1.0
WRITE = posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC
# A command holding none of these bytes means the same to a shell as split on blanks, so it
# is run directly: no shell process per trial (quotes, $, globs, ~, VAR=, ; | & … need one).
SHELL_BYTES = frozenset(b"|&;<>()$`\\\"'*?[]#~=%{}!\n\r\v\f")

_ESCAPES = {i: "\\u%04x" % i for i in range(32)}  # str.translate table for JSON strings
_ESCAPES.update({34: '\\"', 92: "\\\\", 10: "\\n", 13: "\\r", 9: "\\t"})
_LITERALS = {None: "null", True: "true", False: "false"}


def json_string(text):
    """``text`` as a JSON string literal (non-ASCII passes through, as JSON allows)."""
    return '"' + text.translate(_ESCAPES) + '"'


def json_object(values):
    """A flat dict of str / int / float / bool / None as JSON text (for state.json)."""
    items = []
    for key, value in values.items():
        if value is None or value is True or value is False:
            text = _LITERALS[value]
        else:
            text = json_string(value) if isinstance(value, str) else repr(value)
        items.append(json_string(key) + ": " + text)
    return "{" + ", ".join(items) + "}"


def parse_frames(buf):
    """Split NNI's ``ME%06d<json>\\n`` frames off ``buf``: ``(records, rest)``.

    The length counts the newline. A partial frame stays in ``rest`` for the next read;
    bytes that cannot start a frame are skipped up to the next ``ME``.
    """
    records, pos, size = [], 0, len(buf)
    while size - pos >= 8:
        if buf[pos : pos + 2] != b"ME" or not buf[pos + 2 : pos + 8].isdigit():
            found = buf.find(b"ME", pos + 1)
            pos = found if found >= 0 else size - 1  # keep a last "M" that may begin "ME"
            continue
        end = pos + 8 + int(buf[pos + 2 : pos + 8])
        if end > size:
            break
        data = buf[pos + 8 : end].strip()
        if data:
            records.append(data.decode("utf-8", "replace"))
        pos = end
    return records, buf[pos:]


def extract_records(buf):
    """Records in the complete lines of ``buf`` (``NNISDK_MEb'<json>'``): ``(records, rest)``.

    As NNI's own keeper (``NNISDK_MEb'.*'$``), a record runs to the last quote, which must
    end the line. String operations only: most output holds no marker at all.
    """
    cut = buf.rfind(b"\n") + 1
    rest = buf[cut:] if len(buf) - cut <= MAX_LINE else b""
    records = []
    if MARKER in buf[:cut]:
        for line in buf[:cut].split(b"\n"):
            start, line = line.find(MARKER), line.rstrip(b"\r")
            if start >= 0 and line.endswith(b"'") and len(line) > start + len(MARKER) + 1:
                records.append(line[start + len(MARKER) : -1].decode("utf-8", "replace"))
    return records, rest


def frame(record):
    """A spool-file frame: the ``ME%06d`` framing of the NNI SDK."""
    data = record.encode() + b"\n"
    return b"ME%06d" % len(data) + data


def write_file(path, data, atomic=False):
    """Write ``data``; ``atomic``: through a temporary file and a rename (readers never see half).
    With ``posix`` calls: a file object costs three more system calls and a dozen objects."""
    fd = posix.open(path + ".tmp" if atomic else path, WRITE, 0o666)  # as open() makes it
    try:
        view = memoryview(data)
        while view:
            view = view[posix.write(fd, view) :]
    finally:
        posix.close(fd)
    if atomic:
        posix.replace(path + ".tmp", path)


def read_file(path):
    with open(path, "rb") as file:
        return file.read()


def last_line(path, size=4096):
    """The last non-empty line of the file's last ``size`` bytes, at most 200 characters (its
    end), or None: a failed trial's last words (``lastError`` in ``state.json``)."""
    try:
        fd = posix.open(path, posix.O_RDONLY)
    except OSError:
        return None
    try:
        posix.lseek(fd, max(0, posix.fstat(fd).st_size - size), 0)
        tail = posix.read(fd, size)
    finally:
        posix.close(fd)
    for line in reversed(tail.decode("utf-8", "replace").splitlines()):
        if line.strip():
            return line.strip()[-200:]
    return None


def mkdir(path):
    """``mkdir -p``; another keeper making the same directories at the same time is no error."""
    try:
        posix.mkdir(path, 0o755)
    except FileExistsError:
        pass
    except FileNotFoundError:
        mkdir(path.rsplit("/", 1)[0])
        mkdir(path)


def error_message(body):
    """The ``error`` of a gateway answer (a rare path: ``json`` is imported only here)."""
    import json

    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:500]


#: The keeper's settings the trial sees too: its attempt, its checkpoint directory, and the
#: gateway with the trial's ask token, to ask its tuner (docs/optuna.md; never the keeper's token).
FOR_THE_TRIAL = frozenset(
    {
        b"TRIALBUS_ATTEMPT",
        b"TRIALBUS_CHECKPOINT_DIR",
        b"TRIALBUS_GATEWAY_URL",
        b"TRIALBUS_ASK_TOKEN",
        b"TRIALBUS_ASK_OWNER",
    }
)


class Gateway:
    """A minimal HTTP/1.1 client for ``POST <url>/api/v1/trials/<trial>/metrics``.

    One connection per request (``Connection: close``): POSTs are at least ``TICK`` apart,
    and a fresh connection never trips over a keep-alive the server has closed meanwhile.
    """

    def __init__(self, url, experiment, trial, token, attempt=0):
        scheme, _, rest = url.partition("://")
        hostport, _, prefix = rest.partition("/")
        self.tls = scheme == "https"
        host, colon, port = hostport.rpartition(":")
        if not colon or host.startswith("[") and not host.endswith("]"):  # no port
            host, port = hostport, "443" if self.tls else "80"
        self.host, self.port = host.strip("[]"), int(port)
        path = ("/" + prefix).rstrip("/") + "/api/v1/trials/" + trial + "/metrics"
        self.head = (
            f"POST {path} HTTP/1.1\r\nHost: {hostport}\r\nAuthorization: Bearer {token}\r\n"
            f"X-Trialbus-Keeper-Version: {VERSION}\r\nContent-Type: application/json\r\n"
            "Connection: close\r\nContent-Length: "
        )
        self.body_start = '{"experimentId": %s, "attempt": %d, "records": [' % (json_string(experiment), attempt)

    def post(self, records, timeout=10.0):
        """``(status, body)``; status 0 when the gateway could not be reached."""
        body = (self.body_start + ", ".join(map(json_string, records)) + "]}").encode()
        request, chunks = (self.head + str(len(body)) + "\r\n\r\n").encode() + body, []
        try:
            sock = self.connect(timeout)
            try:
                try:
                    sock.sendall(request)
                except OSError:  # the server may answer (413) and close before reading all
                    pass
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
            finally:
                sock.close()
        except OSError as exc:
            if not chunks:
                return 0, "cannot reach the gateway: %s" % (exc,)
        head, _, reply = b"".join(chunks).partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1:2]
        if not status or not status[0].isdigit():
            return 0, "malformed answer from the gateway"
        return int(status[0]), reply.decode("utf-8", "replace")

    def connect(self, timeout):
        if self.tls:  # rare: the heavy modules only when asked for https
            import socket
            import ssl

            raw = socket.create_connection((self.host, self.port), timeout)
            return ssl.create_default_context().wrap_socket(raw, server_hostname=self.host)
        # A str host would go through the idna codec, whose import (re, enum) costs 15 ms.
        host = self.host.encode("ascii" if self.host.isascii() else "idna")
        family, kind, proto, _, address = _socket.getaddrinfo(host, self.port, 0, _socket.SOCK_STREAM)[0]
        sock = _socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        sock.connect(address)  # on failure, the socket is closed when collected
        return sock


class Keeper:
    """One trial: spawn, watch, relay, flush, record. ``run`` returns the exit status.

    ``environ`` is ``posix.environ`` (bytes): the trial's environment is built from it as
    is, and only the keeper's own settings are decoded.
    """

    def __init__(self, environ):
        def setting(name, default=None):
            value = environ.get(b"TRIALBUS_" + name)
            return default if value is None else value.decode("utf-8", "surrogateescape")

        self.environ = environ
        self.dir = environ[b"TRIALBUS_TRIAL_DIR"].decode("utf-8", "surrogateescape")
        if not self.dir.startswith("/"):
            self.dir = posix.getcwd() + "/" + self.dir
        self.command = environ[b"TRIALBUS_TRIAL_COMMAND"]
        self.code_dir = setting(b"CODE_DIR") or self.dir
        self.experiment, self.trial = setting(b"EXPERIMENT_ID", ""), setting(b"TRIAL_ID", "")
        self.kill_grace = float(setting(b"KILL_GRACE") or 5)
        self.flush_timeout = float(setting(b"FLUSH_TIMEOUT") or 600)
        #: Seconds between two POSTs at most while the trial runs (an empty one is a heartbeat); 0: none.
        self.heartbeat = float(setting(b"HEARTBEAT") or 0)
        self.sent_at = time.monotonic()
        self.attempt = int(setting(b"ATTEMPT") or 0)
        url = setting(b"GATEWAY_URL")
        self.gateway = url and Gateway(url, self.experiment, self.trial, setting(b"TRIAL_TOKEN", ""), self.attempt)
        self.sending, self.hello_ok = bool(self.gateway), False
        self.state, self.error, self.log_file = {}, None, None
        self.exit_unrecorded = False  # the exit is in self.state, not yet in state.json
        self.state_written = False
        self.tick, self.taken = TICK, 0
        self.pid = self.pgid = 0
        #: Set by ``fork_trial`` when a trial template forked the trial on this keeper's request (so
        #: it is the template's child, not ours): ``fileno()`` is readable once the trial exited,
        #: ``exit_code()`` its code then (None before), ``lost`` true when the template is gone
        #: (the code is then the one the trial wrote as it ended), ``reap()`` lets the template reap it.
        self.relay = None
        self.pidfd = self.out_r = self.metrics_fd = self.wake_r = self.nni_fd = -1
        self.armed = False  # the kernel will signal (SIGIO) the trial's next write in .nni
        self.exit_code, self.exited_at, self.kill_at = None, 0.0, 0.0
        self.line_rest = self.frame_rest = b""
        self.queue, self.spool = [], []  # records in memory; spool files, oldest first
        self.spool_seq = self.unsent = 0  # unsent: never to be sent (no gateway, 401/403/409)
        self.next_try, self.delay = 0.0, BACKOFF_MIN
        self.signals = self.signals_seen = 0
        self.canceled = self.abandon = False
        self.lingering = False  # stopping: the trial's command exited, the rest of its group has its grace
        self.stopped_at = 0.0  # when a stop signal came (monotonic)

    def path(self, name):
        return self.dir + "/" + name

    def log(self, message):
        """A line in ``.trialbus/keeper.log``, created on first use: a trial that runs as it
        should leaves none (``state.json`` says when it started and how it ended)."""
        if self.log_file is None:
            self.log_file = open(self.path(".trialbus/keeper.log"), "ab", buffering=0)  # noqa: SIM115
        self.log_file.write((time.strftime("%Y-%m-%d %H:%M:%S ") + message + "\n").encode("utf-8", "replace"))

    def update_state(self, **values):
        """Write ``state.json``: the first time in place (no file to replace yet: readers take a
        half-written one for none, and a rename less is an inode less per trial), then atomically."""
        self.state.update(values)
        write_file(self.path(".trialbus/state.json"), json_object(self.state).encode(), atomic=self.state_written)
        self.state_written = True

    # -- the trial -----------------------------------------------------------------------

    def prepare(self):
        mkdir(self.dir + "/.trialbus")  # .nni is made by the NNI SDK, or by reap when it writes there
        if b"TRIALBUS_PARAMETERS" in self.environ:  # read by the trial only: no rename needed
            write_file(self.path("parameter.cfg"), self.environ[b"TRIALBUS_PARAMETERS"])
        if self.environ.get(b"TRIALBUS_CHECKPOINT_DIR"):  # the trial's, kept across its attempts
            mkdir(self.environ[b"TRIALBUS_CHECKPOINT_DIR"].decode("utf-8", "surrogateescape"))
        if not self.gateway:
            self.log("no TRIALBUS_GATEWAY_URL: metrics stay in the trial directory")
        # Signal handlers only count; the wake-up pipe makes select return at once.
        self.wake_r, wake_w = posix.pipe()
        posix.set_blocking(wake_w, False)
        _signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for signum in (_signal.SIGTERM, _signal.SIGINT):
            _signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame):
        self.signals += 1

    def on_write(self, signum, frame):
        self.armed = False  # a one-shot notice: the wake-up pipe has woken select

    def watch_metrics(self):
        """Let the kernel tell the keeper of the trial's writes in ``.nni`` (dnotify, one notice
        per quiet spell: ``quiet``), so a quiet trial's file need not be read every ``TICK_MAX``.
        Set up after the trial started (a trial forked from a template inherits none of it);
        where there is no dnotify the file is read every ``TICK_MAX``."""
        if not hasattr(fcntl, "F_NOTIFY"):  # not Linux
            return
        try:
            mkdir(self.path(".nni"))
            self.nni_fd = posix.open(self.path(".nni"), posix.O_RDONLY | posix.O_DIRECTORY)
        except OSError:
            return
        _signal.signal(_signal.SIGIO, self.on_write)

    def quiet(self):
        """The next tick of a quiet trial: arm the notice of its next write, then read the file once
        more (a write just before arming is not missed); ``QUIET_TICK`` unless something is due."""
        if self.nni_fd < 0 or self.kill_at or self.queue or self.spool or self.sending and not self.hello_ok:
            return TICK_MAX
        if not self.armed:
            try:
                fcntl.fcntl(self.nni_fd, fcntl.F_NOTIFY, fcntl.DN_MODIFY | fcntl.DN_CREATE)
            except OSError:  # a file system without dnotify: read it every TICK_MAX
                posix.close(self.nni_fd)
                self.nni_fd = -1
                return TICK_MAX
            self.armed = True
        taken = self.taken
        self.read_metrics()
        if self.taken != taken:
            return TICK
        beat = self.sent_at + self.heartbeat - time.monotonic() if self.heartbeat else QUIET_TICK
        return max(TICK, min(QUIET_TICK, beat))

    def trial_env(self):
        environ, encode = self.environ, lambda text: text.encode("utf-8", "surrogateescape")
        env = {k: v for k, v in environ.items() if not k.startswith(b"TRIALBUS_") or k in FOR_THE_TRIAL}
        env[b"NNI_PLATFORM"] = environ.get(b"TRIALBUS_NNI_PLATFORM") or b"local"
        env[b"NNI_EXP_ID"], env[b"NNI_TRIAL_JOB_ID"] = encode(self.experiment), encode(self.trial)
        env[b"NNI_SYS_DIR"] = env[b"NNI_OUTPUT_DIR"] = encode(self.dir)
        env[b"NNI_TRIAL_SEQ_ID"] = environ.get(b"TRIALBUS_SEQUENCE_ID", b"-1")
        env[b"NNI_CODE_DIR"], env[b"MULTI_PHASE"] = encode(self.code_dir), b"false"
        if b"TRIALBUS_GPUS" in environ:
            env[b"CUDA_VISIBLE_DEVICES"] = environ[b"TRIALBUS_GPUS"]
        if environ.get(b"TRIALBUS_PYTHONPATH_PREPEND"):
            paths = [environ[b"TRIALBUS_PYTHONPATH_PREPEND"], env.get(b"PYTHONPATH")]
            env[b"PYTHONPATH"] = b":".join(filter(None, paths))
        return env

    #: Set by a trial template (trial_template.py): ``fork_trial(keeper, out_w, env)`` forks the
    #: trial from the template's warm interpreter; its pid, or 0 to start the trial cold.
    fork_trial = None

    def spawn(self):
        out_r, out_w = posix.pipe()  # close-on-exec both; dup2 onto fd 1 clears it there
        actions = [
            (posix.POSIX_SPAWN_OPEN, 0, "/dev/null", posix.O_RDONLY, 0),
            (posix.POSIX_SPAWN_DUP2, out_w, 1),
            (posix.POSIX_SPAWN_OPEN, 2, self.path("stderr"), WRITE, 0o644),
        ]
        out = posix.open(self.path("stdout"), WRITE, 0o644)  # a raw fd: a forked trial closes it
        posix.chdir(self.code_dir)
        # setsid: the trial leads its own group, which one killpg reaches. Python ignores
        # SIGPIPE and SIGXFSZ; the trial gets their defaults back, as with subprocess.
        argv, env, sigdef = self.command.split(), self.trial_env(), (_signal.SIGPIPE, _signal.SIGXFSZ)
        self.pid = 0
        if self.fork_trial is not None:
            if self.log_file is not None:  # no file object of ours may be inherited by the trial
                self.log_file.close()
                self.log_file = None
            try:
                self.pid = self.fork_trial(out_w, env)
            except OSError as exc:
                self.log("cannot fork the trial from its template (%s): starting it cold" % exc)
        warm = bool(self.pid)
        if not self.pid and argv and SHELL_BYTES.isdisjoint(self.command):
            try:  # looked up on the keeper's PATH, which the trial inherits
                self.pid = posix.posix_spawnp(argv[0], argv, env, file_actions=actions, setsid=True, setsigdef=sigdef)
            except OSError:
                pass  # not found, not executable: let the shell say so in stderr, exit 127
        if not self.pid:
            self.pid = posix.posix_spawn(
                b"/bin/sh", [b"/bin/sh", b"-c", self.command], env, file_actions=actions, setsid=True, setsigdef=sigdef
            )
        posix.close(out_w)
        self.pgid, self.out_r, self.out = self.pid, out_r, open(out, "wb", buffering=0)  # noqa: SIM115
        try:  # a pidfd wakes select the moment the trial exits (Linux >= 5.3); a relay's channel does
            self.pidfd = -1 if self.relay is not None else posix.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = -1
        self.watch_metrics()
        started = {"warm": True} if warm else {}  # forked from a template
        self.update_state(keeperPid=posix.getpid(), trialPid=self.pid, pgid=self.pgid, startTime=time.time(), **started)

    def loop(self):
        """Relay output and metrics until the trial is over, then flush what is left."""
        self.pump()
        while True:
            running = self.pid or self.out_r >= 0
            if running:
                timeout = min(self.tick, self.kill_at - time.monotonic()) if self.kill_at else self.tick
            elif (self.queue or self.spool) and self.sending and not self.abandon:
                if self.exit_unrecorded:  # the gateway is slow to take the rest: say how the trial ended
                    self.update_state()
                    self.exit_unrecorded = False
                deadline = self.exited_at + self.flush_timeout
                if time.monotonic() >= deadline:
                    return self.log("flush timeout: records left unsent")
                timeout = min(self.next_try, deadline) - time.monotonic()
            else:
                return
            # an exited trial whose group has its grace period (``reap``) is looked at every tick instead
            exited = self.pidfd if self.relay is None else self.relay.fileno()
            fds = [fd for fd in (self.wake_r, self.out_r, -1 if self.lingering else exited) if fd >= 0]
            ready = select(fds, [], [], max(timeout, 0))[0]
            if self.wake_r in ready:
                posix.read(self.wake_r, 512)
            if self.out_r in ready:
                self.read_stdout()
            if self.pid:
                self.reap()
            elif self.out_r >= 0 and time.monotonic() - self.exited_at > DRAIN_AFTER_EXIT:
                self.close_stdout()  # a daemon that left the group still holds the pipe
            taken = self.taken
            self.read_metrics()
            self.tick = TICK if self.taken != taken or self.out_r in ready else min(self.tick * 2, TICK_MAX)
            if self.tick == TICK_MAX and self.pid:
                self.tick = self.quiet()
            self.control()
            self.pump()

    def read_stdout(self):
        data = posix.read(self.out_r, 65536)
        if not data:
            return self.close_stdout()
        try:
            self.out.write(data)
        except OSError as exc:  # disk full: relay metrics all the same
            self.log("cannot write stdout: %s" % exc)
        records, self.line_rest = extract_records(self.line_rest + data if self.line_rest else data)
        self.take(records)

    def close_stdout(self):
        if self.line_rest:  # a last line without a newline
            self.take(extract_records(self.line_rest + b"\n")[0])
            self.line_rest = b""
        posix.close(self.out_r)
        self.out_r = -1

    def read_metrics(self):
        if self.metrics_fd < 0:
            try:
                self.metrics_fd = posix.open(self.path(".nni/metrics"), posix.O_RDONLY)
            except OSError:
                return  # not written yet
        data = self.frame_rest
        while chunk := posix.read(self.metrics_fd, 65536):  # a larger buffer is an mmap and munmap per read
            data += chunk
        records, self.frame_rest = parse_frames(data)
        self.take(records)

    def take(self, records):
        self.taken += len(records)
        if self.sending:
            self.queue += records
        else:
            self.unsent += len(records)

    def reap(self):
        # Peek (WNOWAIT) before reaping: while the trial is an unreaped zombie its pid, the
        # group's id, cannot be reused, so the killpg cannot reach an unrelated group.
        if self.relay is not None:  # its parent, the template, reaps it when told
            if self.relay.exit_code() is None:
                return
        elif posix.waitid(posix.P_PID, self.pid, posix.WEXITED | posix.WNOHANG | posix.WNOWAIT) is None:
            return
        # Being stopped (SIGTERM sent, grace running): a shell that ran the trial's program dies at
        # once, its child may still be saving a checkpoint. The group keeps its grace period, then
        # ``control`` SIGKILLs it. (The zombie stays unreaped meanwhile: the group's id stays ours.)
        self.lingering = bool(self.kill_at) and time.monotonic() < self.kill_at and self.group_lives()
        if self.lingering:
            return
        if self.relay is None:
            self.killpg(_signal.SIGKILL)  # whatever the trial left behind in its group
            code = posix.waitstatus_to_exitcode(posix.waitpid(self.pid, 0)[1])
        else:
            if not self.relay.lost:  # (else the trial was reaped by init: its id may be anyone's now)
                self.killpg(_signal.SIGKILL)
            code = self.relay.exit_code()
            self.relay.reap()
            if self.relay.lost:
                self.log("the trial template ended before the trial: its exit status is the one it wrote (1 if none)")
        self.exit_code, self.pid, self.exited_at = code, 0, time.monotonic()
        if self.pidfd >= 0:
            posix.close(self.pidfd)
            self.pidfd = -1
        now = time.time()
        self.state.update(exitCode=self.exit_code, endTime=now)
        if self.exit_code:  # a failure: its last stderr line says why to whoever watches (§1)
            self.state["lastError"] = last_line(self.path("stderr"))
        self.exit_unrecorded = True
        try:
            write_file(self.path(".nni/state"), b"%d %d\n" % (self.exit_code, int(now * 1000)))
        except FileNotFoundError:  # the trial never used NNI's file channel
            mkdir(self.path(".nni"))
            write_file(self.path(".nni/state"), b"%d %d\n" % (self.exit_code, int(now * 1000)))

    def group_lives(self):
        """Whether a process of the trial's group other than its (exited) leader still runs: read
        from ``/proc``, only while a stop's grace period runs; False where there is no ``/proc``."""
        try:
            names = posix.listdir("/proc")
        except OSError:
            return False
        for name in names:
            if not name.isdigit() or int(name) == self.pid:
                continue
            try:
                fields = read_file("/proc/%s/stat" % name).rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[2]) == self.pgid and fields[0] != b"Z":  # pgrp, state
                return True
        return False

    def killpg(self, signum):
        try:
            posix.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass  # the group is gone already

    def stop_trial(self, why):
        """SIGTERM to the group now, SIGKILL after the grace period (see ``control``)."""
        self.log("stopping the trial: %s" % why)
        self.killpg(_signal.SIGTERM)
        self.kill_at = time.monotonic() + self.kill_grace

    #: Set by a trial template that keeps its keepers for trial after trial: a stop signal is
    #: then this keeper's trial's only once the adapter wrote ``.trialbus/cancel`` (it writes
    #: the file before it signals), so a signal meant for the trial the keeper kept before,
    #: which may come late, stops nothing.
    reusable = False

    def stop_asked(self):
        """Whether the stop signals received are for this trial."""
        return not self.reusable or posix.access(self.path(".trialbus/cancel"), posix.F_OK)

    def close(self):
        """Close what keeping this trial opened, and stop handling signals (a keeper kept for
        another trial; any other keeper simply exits)."""
        wake_w = _signal.set_wakeup_fd(-1)
        for fd in (wake_w, self.wake_r, self.out_r, self.pidfd, self.metrics_fd, self.nni_fd):
            if fd >= 0:
                posix.close(fd)
        self.wake_r = self.out_r = self.pidfd = self.metrics_fd = self.nni_fd = -1
        self.relay = None
        for file in (getattr(self, "out", None), self.log_file):
            if file is not None:
                file.close()
        for signum in (_signal.SIGTERM, _signal.SIGINT):  # a stop between trials ends the keeper
            _signal.signal(signum, _signal.SIG_DFL)
        _signal.signal(_signal.SIGIO, _signal.SIG_IGN)

    def control(self):
        """Act on the signals received and on the kill deadline."""
        if self.signals != self.signals_seen:
            self.signals_seen = self.signals
            if not self.stop_asked():
                self.log("a stop signal without .trialbus/cancel: for the trial kept before; ignored")
            elif not self.pid:
                self.abandon = True  # the trial is over already: stop flushing, exit
            elif not self.canceled:
                self.canceled, self.stopped_at = True, time.monotonic()
                self.stop_trial("the keeper received a stop signal")
            elif time.monotonic() - self.stopped_at >= SAME_STOP:
                self.kill_at = time.monotonic()  # a second signal: SIGKILL now
        if self.pid and self.kill_at and time.monotonic() >= self.kill_at:
            self.log("SIGKILL to the trial's group")
            self.killpg(_signal.SIGKILL)
            self.kill_at = 0.0

    # -- the gateway ---------------------------------------------------------------------

    def pump(self):
        """Send what is due: the hello, spooled batches (oldest first), then the queue."""
        if not self.sending or time.monotonic() < self.next_try:
            return
        if not self.hello_ok:
            if not (self.queue or self.spool):
                if self.exit_code is None and time.time() - self.state.get("startTime", 0.0) < HELLO_AFTER:
                    return  # a short trial's first batch announces the version: one request less
                if self.deliver([]) is not None:
                    return self.fail([])
            self.hello_ok = True  # with records waiting, their batch carries the version
        while self.spool and self.sending:
            try:
                data = read_file(self.spool[0])
            except FileNotFoundError:  # relayed by the adapter meanwhile (remote: over SSH)
                self.spool.pop(0)
                continue
            left = self.deliver(parse_frames(data)[0])
            if left is not None:
                write_file(self.spool[0], b"".join(map(frame, left)), atomic=True)
                return self.fail([])
            if self.sending:  # batches refused with 401/403/409 stay on disk
                posix.unlink(self.spool.pop(0))
        due = self.heartbeat and self.pid and not self.queue and time.monotonic() - self.sent_at >= self.heartbeat
        if due and self.deliver([]) is not None:  # a heartbeat: alive, with nothing to report
            return self.fail([])
        while self.queue and self.sending:
            count = size = 0
            while count < len(self.queue) and count < MAX_BATCH and size < MAX_BATCH_BYTES:
                size, count = size + len(self.queue[count]), count + 1
            batch, self.queue = self.queue[:count], self.queue[count:]
            left = self.deliver(batch)
            if left is not None:
                return self.fail(left)
        self.delay, self.next_try = BACKOFF_MIN, time.monotonic() + TICK

    def deliver(self, records):
        """POST ``records``: None once settled, else the records to retry later."""
        status, body = self.gateway.post(records)
        if status == 200:
            self.sent_at = time.monotonic()
            return None
        if status in (400, 413) and len(records) > 1:
            half = len(records) // 2  # 413: halve; 400: one by one, to drop only the bad
            parts = [[r] for r in records] if status == 400 else [records[:half], records[half:]]
            for i, part in enumerate(parts):
                left = self.deliver(part)
                if left is not None:
                    return left + [r for later in parts[i + 1 :] for r in later]
            return None
        if status in (400, 413):
            dropped = records[0][:300] if records else "(hello)"
            self.log("gateway refused (%d): %s; dropped %s" % (status, error_message(body), dropped))
            return None
        if status in (401, 403, 409):
            self.error = "metrics gateway answered %d: %s" % (status, error_message(body))
            self.log(self.error + "; no more metrics will be sent")
            self.unsent += len(records) + len(self.queue)  # and the spool stays unsent
            self.sending, self.queue = False, []
            if status == 409 and self.pid:
                self.stop_trial("keeper version refused by the gateway")
            return None
        self.log("%s (%d); retrying in %.1fs" % (error_message(body) if status else body, status, self.delay))
        return records

    def fail(self, left):
        """A send failed: spool what is unsent, and back off. The failed batch is spooled on its
        own, so that it is sent again as it was (the gateway may have published it: the same
        batch is a repeat the stream drops), and the queue after it."""
        for records in (left, self.queue):
            if records:
                if not self.spool_seq:
                    mkdir(self.path(".trialbus/spool"))  # only now: each new inode costs
                self.spool_seq += 1
                self.spool.append(self.path(".trialbus/spool/%08d" % self.spool_seq))
                write_file(self.spool[-1], b"".join(map(frame, records)), atomic=True)
        self.queue = []
        self.next_try = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, BACKOFF_MAX)

    # -- start and end -------------------------------------------------------------------

    def run(self):
        self.prepare()
        if self.signals and self.stop_asked():  # stopped before the trial started
            self.canceled = True
        else:
            try:
                self.spawn()
            except OSError as exc:
                self.error = "cannot start the trial: %s" % exc
                self.log(self.error)
                self.exit_code = 127  # what /bin/sh answers for a command it cannot run
                self.state.update(exitCode=127, endTime=time.time(), lastError=self.error)
            else:
                self.loop()
        if self.queue:  # keep unsent records on disk, where an operator can find them
            self.fail([])
        flushed = not self.queue and not self.spool and self.unsent == 0
        # keeperPid also when the trial never started: a restarted adapter knows the keeper is gone
        self.update_state(
            keeperPid=posix.getpid(), done=True, metricsFlushed=flushed, canceled=self.canceled, error=self.error
        )
        if not flushed or self.canceled or self.error:
            self.log("done: metricsFlushed=%s canceled=%s error=%s" % (flushed, self.canceled, self.error))
        code = 1 if self.exit_code is None else self.exit_code
        return 128 - code if code < 0 else code

    def crash(self, exc):
        """The keeper itself failed: leave no trial behind and say why in state.json."""
        import traceback

        if self.pid:
            self.killpg(_signal.SIGKILL)
        self.error = "keeper failed: %r" % (exc,)
        sys.stderr.write("".join(traceback.format_exception(exc)))
        try:
            self.update_state(
                keeperPid=posix.getpid(), done=True, metricsFlushed=False, canceled=self.canceled, error=self.error
            )
        except OSError:
            pass


last_keeper = None  # the Keeper of the last run_keeper (a keeper kept for more trials closes it)


def run_keeper(environ):
    """Run one trial with the settings in ``environ`` (bytes → bytes); the exit status."""
    global last_keeper
    last_keeper = None
    try:
        keeper = last_keeper = Keeper(environ)
    except (KeyError, ValueError) as exc:
        sys.stderr.write("trial_keeper: bad configuration (missing or invalid %s)\n" % exc)
        return 2
    pid = posix.getpid()
    try:
        return keeper.run()
    except BaseException as exc:  # noqa: BLE001 - never leave a trial orphaned; say why
        if posix.getpid() != pid:  # a trial forked from a template, on its way to run: not ours
            raise
        keeper.crash(exc)
        return 1


def read_exact(fd, size):
    data = b""
    while len(data) < size:
        chunk = posix.read(fd, size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def zygote():
    """Fork one keeper per request, so a trial pays a fork (~1 ms), not an interpreter start.

    Requests on stdin: ``%08d`` length, then ``KEY=VALUE`` pairs separated by NUL (the
    keeper's environment). Answer on stdout: the new keeper's pid and a newline. Each
    keeper runs in its own session with stdout and stderr on ``.trialbus/keeper.out``,
    exactly as if started on its own, and outlives the zygote. The zygote ends at EOF
    (its adapter is gone); it never waits for keepers: the kernel reaps them.
    """
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    import gc

    time.strftime("%Z")  # load the time zone once, for every keeper
    gc.freeze()  # a keeper's collections then leave the zygote's objects (and their pages) alone
    while True:
        head = read_exact(0, 8)
        if not head:
            return 0
        posix.write(1, b"%d\n" % fork_keeper(read_exact(0, int(head))))


def fork_keeper(environ, close_fds=(), next_trial=None):
    """Fork a keeper for ``environ`` in its own session, as if started on its own: stdin
    /dev/null, stdout and stderr on ``.trialbus/keeper.out`` (which must exist); the pid.
    ``environ``: a dict, or a request's bytes as a zygote reads them (:func:`parse_settings`),
    parsed in the child: after a fork, each page the parent writes is copied, so a zygote or
    template does as little as it can per keeper. ``close_fds``: the caller's descriptors the
    keeper must not hold (used by the remote agent). ``next_trial(status)``, called in the
    keeper once its trial is over: the next trial's settings (bytes) for the same keeper, or
    None to exit (used by a trial template that keeps its keepers)."""
    pid = posix.fork()
    if pid:
        return pid
    me, status = posix.getpid(), 2  # (2: no settings at all, as a bad configuration)
    try:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the keeper waits for its trial
        posix.setsid()
        for fd in close_fds:
            posix.close(fd)
        null = posix.open(b"/dev/null", posix.O_RDONLY)
        posix.dup2(null, 0)
        posix.close(null)
        while environ:
            if isinstance(environ, bytes):
                environ = parse_settings(environ)
            if b"PATH" in environ:  # the trial's command is looked up on the keeper's own PATH
                posix.putenv(b"PATH", environ[b"PATH"])
            out = posix.open(
                environ[b"TRIALBUS_TRIAL_DIR"] + b"/.trialbus/keeper.out",
                posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND,
                0o644,
            )
            posix.dup2(out, 1)
            posix.dup2(out, 2)
            posix.close(out)
            status = run_keeper(environ)
            sys.stdout.flush()
            sys.stderr.flush()
            environ = next_trial and next_trial(status)
    except BaseException:  # noqa: BLE001 - never return into the caller's loop in the child
        if posix.getpid() != me:  # a trial forked from a template (trial_template.py)
            raise
        status = 1
    posix._exit(status)


def parse_settings(data):
    """KEY=VALUE items separated by NUL (a zygote's request, a ``--env`` file), as bytes → bytes."""
    return dict(item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)


def read_settings(path):
    """A settings file (``--env``)."""
    return parse_settings(read_file(path))


def run_as(value):
    """Become the trial's Unix user (``TRIALBUS_RUN_AS``: ``uid:gid:group,…``, set by an adapter that
    runs as root: docs/security.md) before reading a setting or running a trial: supplementary
    groups, group, then user, which leaves no way back to root. OSError when it cannot."""
    uid, gid, groups = value.split(b":")
    if posix.geteuid() == int(uid):
        return  # already that user (an adapter that is not root runs trials as itself)
    posix.setgroups([int(g) for g in groups.split(b",") if g])
    posix.setgid(int(gid))
    posix.setuid(int(uid))


def main():
    if sys.argv[1:2] == ["--version"]:
        print(VERSION)
        return 0
    if b"TRIALBUS_RUN_AS" in posix.environ:  # a keeper asked to switch never runs a trial as root
        try:
            run_as(posix.environ[b"TRIALBUS_RUN_AS"])
        except (OSError, ValueError) as exc:
            sys.stderr.write("trial_keeper: cannot become the trial's user (%s)\n" % exc)
            return 2
    if sys.argv[1:2] == ["--zygote"]:
        return zygote()
    if sys.argv[1:2] == ["--env"] and len(sys.argv) > 2:
        # Settings from a file (KEY=VALUE items separated by NUL, as the zygote reads them),
        # under the environment (which wins): where people can read the job spec (OpenPAI),
        # the trial's token stays out of the command.
        environ = read_settings(sys.argv[2])
        environ.update(posix.environ)
        return run_keeper(environ)
    return run_keeper(posix.environ)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown (module cleanup, a last GC): ~3 ms per trial, and
    # every file the keeper wrote is closed already.
    posix._exit(status)
