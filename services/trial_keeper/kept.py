"""Keepers a trial template keeps for trial after trial, and the trials it forks on their request
(``trial_template.py`` loads this file by path, as ``_trialbus_kept``, when its spec says
``reuse``; stdlib only, like the keeper).

Forking a keeper per trial from the template costs the fork, the keeper's exit, and every page
the keeper writes (each is copied from the template); a keeper that forks its trial then shares
its pages with it again. So a kept keeper never forks: the **template** forks the trial on the
keeper's request, from its own clean state, and is the trial's parent. The keeper then writes
only pages of its own, shared with no one, and the kernel copies nothing for it.

Each kept keeper has a channel to the template, a UNIX stream socket:

- template → keeper: a request (``%08d`` length, then the keeper's settings, as the pool sent
  it); ``p%08d``: the pid of the trial it forked on the keeper's request; ``x%+08d``: that trial
  exited with this code (it stays a zombie, its group's id reserved, until the keeper answers
  ``r``: the keeper's last ``killpg`` cannot reach anyone else's group);
- keeper → template: ``t%08d`` and the trial's settings, with the write end of its stdout pipe
  (``SCM_RIGHTS``): fork the trial; ``r``: reap it; ``f``: my trial is over and the adapter
  was told (:func:`next_trial`), hand me the next request.

A keeper ends after :data:`TRIALS` trials, after a trial that was stopped (a second stop signal
could come late), when it cannot tell the adapter its trial's end, or at EOF on its channel. A
template whose pool closed it (EOF on its requests) relays its kept keepers' trials to their end
before it exits; one that dies takes their exit statuses along: each such trial, its parent gone,
writes its own in ``.trialbus/exit`` as it ends (not when a signal or ``os._exit`` ends it: the
keeper then records 1, and says why in its log).
Per message O(1); per wake-up of the template O(its keepers).
"""

import _signal  # type: ignore[import-not-found]  # no stub in typeshed for signal's C module
import _socket
import posix
import sys
from select import select

TRIALS = 200  # trials a keeper keeps at most
IDLE = 64  # keepers waiting for a trial at most: one more ends
template = None  # the template's module (trial_template.py), set by it
channel = None  # in a kept keeper: its channel (a socket), for fork_trial


class Kept:
    """The template's side: its kept keepers, and the trials it forked for them."""

    def __init__(self, requests, answers):
        self.requests, self.answers = requests, answers
        self.keepers = {}  # channel fd → [socket, keeper pid, its trial's pid or 0]
        self.idle = []  # channel fds of keepers waiting for a trial
        self.trials = {}  # trial pid → the channel fd of its keeper (None: its keeper is gone)
        self.ended = set()  # pids of keepers gone, to reap
        # Trials are this process's children: their exits must be waited for (not ignored)
        self.wake_r, wake_w = posix.pipe()
        posix.set_blocking(wake_w, False)
        _signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
        self.fds = (self.wake_r, wake_w)

    def wait(self):
        """Block until a request comes (True) or something else happened (False: handled)."""
        ready = select([self.requests, self.wake_r, *self.keepers], [], [])[0]
        return self.handle(ready)

    def drain(self):
        """No more requests (the pool closed this template): the idle keepers end, and the others
        once their trial is over, whose exit this process still relays: never lost with it."""
        self.draining = True
        for fd in list(self.idle):
            self.drop(fd)
        while self.keepers:
            self.handle(select([self.wake_r, *self.keepers], [], [])[0])

    draining = False

    def handle(self, ready):
        for fd in ready:
            if fd == self.wake_r:
                posix.read(self.wake_r, 512)
                self.exits()
            elif fd != self.requests and fd in self.keepers:
                self.heard(fd)
        return self.requests in ready

    def heard(self, fd):
        sock = self.keepers[fd][0]
        try:
            said, ancillary, _, _ = sock.recvmsg(1, _socket.CMSG_SPACE(4))
        except OSError:
            said, ancillary = b"", []
        if said == b"f" and len(self.idle) < IDLE and not self.draining:
            self.idle.append(fd)
        elif said == b"t" and ancillary:
            out_w = int.from_bytes(ancillary[0][2][:4], sys.byteorder, signed=True)
            read_exact = template.keeper_module.read_exact
            head = read_exact(fd, 8)
            payload = head.isdigit() and read_exact(fd, int(head))
            if payload:
                self.fork_trial(fd, payload, out_w)
            else:  # it died saying it
                posix.close(out_w)
                self.drop(fd)
        elif said == b"r":
            self.reap(self.keepers[fd][2])
            self.keepers[fd][2] = 0
        else:  # gone (EOF), or one idle keeper too many: its channel closed, it ends
            self.drop(fd)

    def drop(self, fd):
        sock, pid, trial = self.keepers.pop(fd)
        sock.close()
        self.ended.add(pid)
        if fd in self.idle:
            self.idle.remove(fd)
        if trial:
            self.trials[trial] = None  # reaped when it exits
        self.exits()

    def hand(self, payload):
        """Give the request to an idle keeper: its pid, or 0 when there is none."""
        while self.idle:
            fd = self.idle.pop()
            try:
                posix.write(fd, b"%08d" % len(payload) + payload)  # blocking: it reads all
            except OSError:
                self.drop(fd)
                continue
            return self.keepers[fd][1]
        return 0

    def fork(self, payload):
        """Fork a keeper for the request, kept for more; its pid."""
        global channel
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        channel = theirs  # the keeper's, in the keeper
        try:
            pid = template.keeper_module.fork_keeper(
                payload, (self.requests, self.answers, ours.fileno(), *self.fds, *self.keepers), next_trial
            )
        except OSError:  # no fork
            ours.close()
            theirs.close()
            raise
        finally:
            channel = None  # (in this process: the keeper never returns here)
        theirs.close()
        self.keepers[ours.fileno()] = [ours, pid, 0]
        return pid

    def fork_trial(self, fd, payload, out_w):
        """Fork the trial a keeper asked for (``payload``: see :func:`request`); tell it the pid."""
        import gc

        gc.freeze()  # what this process made since: the trial's collections never visit it
        try:
            pid = posix.fork()
        except OSError:
            pid = -1  # the keeper starts it cold
        if pid == 0:  # in the trial: become it (this never returns)
            become(payload, out_w)
        posix.close(out_w)
        pid = max(pid, 0)
        if pid:
            self.keepers[fd][2] = pid
            self.trials[pid] = fd
        try:
            posix.write(fd, b"p%08d" % pid)
        except OSError:
            self.drop(fd)

    def exits(self):
        """Tell keepers their trials exited (peeked: left unreaped until the keeper says ``r``);
        reap the trials of keepers gone, and keepers gone."""
        for pid, fd in list(self.trials.items()):
            try:
                found = posix.waitid(posix.P_PID, pid, posix.WEXITED | posix.WNOHANG | posix.WNOWAIT)
            except ChildProcessError:
                found = None
                del self.trials[pid]
            if found is None:
                continue
            if fd is None:
                self.reap(pid)
                continue
            code = found.si_status if found.si_code == posix.CLD_EXITED else -found.si_status
            del self.trials[pid]  # told once; reaped on the keeper's word
            try:
                posix.write(fd, b"x%+08d" % code)
            except OSError:
                self.reap(pid)
        for pid in list(self.ended):
            try:
                if posix.waitpid(pid, posix.WNOHANG)[0]:
                    self.ended.discard(pid)
            except ChildProcessError:
                self.ended.discard(pid)

    def reap(self, pid):
        if pid:
            try:
                posix.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self.trials.pop(pid, None)


def become(payload, out_w):
    """In a trial the template forked for a keeper: become the trial (or start it cold)."""
    t = template
    try:
        fields = payload.split(b"\0")
        command, path, code_dir, trial_dir, stderr = fields[:5]
        env = dict(item.split(b"=", 1) for item in fields[5:])
        plan = t.plans.get((command, path or None, code_dir)) or t.parse_command(command, path, code_dir)
        trial_dir, stderr = (name.decode("utf-8", "surrogateescape") for name in (trial_dir, stderr))
    except BaseException:  # noqa: BLE001 - never run the template's code in the trial
        posix._exit(127)
    try:
        if "script" in plan:
            plan = dict(plan, stat=posix.stat(plan["script"]))
        t.trial_module.become_trial(plan, env, out_w, stderr, trial_dir, t.library_fds)
    except BaseException as exc:  # noqa: BLE001 - never run the template's code in the trial
        t.trial_module.cold(plan, env, exc, trial_dir)
    raise t.StartTrial(plan)


# -- the keeper's side ---------------------------------------------------------------------


class Relayed:
    """``Keeper.relay``: a trial the template forked on this keeper's request."""

    def __init__(self, sock, pid, trial_dir):
        self.sock, self.pid, self.code, self.lost, self.pidfd = sock, pid, None, False, -1
        self.trial_dir = trial_dir

    def fileno(self):
        """Readable once the trial exited; -1 once reaped (nothing more to wait for)."""
        if self.reaped:
            return -1
        return self.pidfd if self.lost else self.sock.fileno()

    reaped = False

    def exit_code(self):
        if self.code is None and not self.lost:
            try:
                said = self.sock.recv(9, _socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            except OSError:
                said = b""
            if said[:1] == b"x":
                said += template.keeper_module.read_exact(self.sock.fileno(), 9 - len(said)) if len(said) < 9 else b""
                self.code = int(said[1:9])
            else:  # the template is gone: the trial is init's child now, its exit status lost
                self.lost = True
                try:
                    self.pidfd = posix.pidfd_open(self.pid)
                except OSError:
                    self.pidfd = -1  # gone already
        if self.lost and self.code is None and (self.pidfd < 0 or select([self.pidfd], [], [], 0)[0]):
            try:  # what the trial wrote as it ended (not when a signal or os._exit ended it)
                with open(self.trial_dir + "/.trialbus/exit", "rb") as file:
                    self.code = int(file.read())
            except (OSError, ValueError):
                self.code = 1
        return self.code

    def reap(self):
        self.reaped = True
        if self.pidfd >= 0:
            posix.close(self.pidfd)
            self.pidfd = -1
        if not self.lost:
            try:
                self.sock.send(b"r")
            except OSError:
                pass


def request(keeper, out_w, env):
    """In a kept keeper: ask the template to fork the trial; its pid (0: start it cold). The
    request: command, PATH, code directory, trial directory, stderr file, then the environment."""
    fields = [
        keeper.command,
        env.get(b"PATH") or b"",
        keeper.code_dir.encode("utf-8", "surrogateescape"),
        keeper.dir.encode("utf-8", "surrogateescape"),
        keeper.path("stderr").encode("utf-8", "surrogateescape"),
    ]
    payload = b"\0".join(fields + [k + b"=" + v for k, v in env.items()])
    fd = out_w.to_bytes(4, sys.byteorder, signed=True)
    channel.sendmsg([b"t%08d" % len(payload) + payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd)])
    answer = template.keeper_module.read_exact(channel.fileno(), 9)
    if answer[:1] != b"p":
        raise OSError("the template did not fork the trial")
    pid = int(answer[1:])
    if pid:
        keeper.relay = Relayed(channel, pid, keeper.dir)
    return pid


served = 0  # in a kept keeper: the trials it kept


def next_trial(status):
    """In a kept keeper, its trial over: tell the adapter (the trial's ``TRIALBUS_DONE_SOCKET``, a
    UNIX datagram socket, ``@`` for the abstract namespace) and the template, then wait for the next
    request; its settings (bytes), or None to end."""
    global served
    keeper, served = template.keeper_module.last_keeper, served + 1
    if keeper is None or keeper.canceled or keeper.error or served >= TRIALS or channel is None:
        return None
    keeper.close()
    address = keeper.environ.get(b"TRIALBUS_DONE_SOCKET")
    if not address:
        return None  # the adapter learns a trial's end from its keeper's exit only
    try:
        notice = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        try:
            notice.sendto(
                keeper.dir.encode("utf-8", "surrogateescape"),
                _socket.MSG_DONTWAIT,
                b"\0" + address[1:] if address.startswith(b"@") else address,
            )
        finally:
            notice.close()
        channel.send(b"f")
        read_exact = template.keeper_module.read_exact
        head = read_exact(channel.fileno(), 8)
        return head and read_exact(channel.fileno(), int(head)) or None
    except OSError:  # the adapter or the template is gone: end (the adapter sees this keeper exit)
        return None
