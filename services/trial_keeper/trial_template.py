"""Trialbus trial template: a Python process that has imported a trial's heavy modules and
forks one process per trial, so a trial pays a fork (~2 ms), not an interpreter start and
its imports (seconds for nni, scikit-learn or torch).

An adapter starts it with the trial's own interpreter, flags and environment (minus what
differs per trial), in the trial's code directory::

    <python> [flags] trial_template.py <trial_keeper.py> <spec.json>

``spec.json``: ``{"python": path, "flags": [option, …], "preload": [module, …], "code_dir":
path, "shim": folder, "unset": [variable, …]}`` (the interpreter and options it was started
with, as :func:`parse_command` gives them; the ``nni`` shim's folder; variables the pool set for
the template alone, which it removes from its environment as it starts). Channels: requests on stdin
and answers on stdout, as the keeper's zygote has them (``%08d`` length, then the keeper's
``KEY=VALUE`` settings separated by NUL; the answer is the keeper's pid and a newline). The
template first moves both channels off fds 0 and 1 (stdin becomes /dev/null, stdout the log
on stderr), so whatever an import prints cannot corrupt them, then preloads the modules one
top-level package at a time and answers ``ready <loaded> <failed>`` — or ``unsafe <module>``
and exits 3 when an import initialised a GPU (see :func:`gpu_touched`): a fork after CUDA is
initialised breaks the child, so such a module must never be preloaded. A request of
:data:`MORE` and module names is the pool's learning: the template imports them beside the
others and answers ``ready …`` (or ``unsafe …``) again, as at its start.

Each request forks a keeper (``trial_keeper.fork_keeper``: its own session, as if started on
its own) whose ``Keeper.fork_trial`` hook forks the trial instead of spawning an interpreter,
when the command is a Python script or module run by this template's interpreter and flags
(:func:`parse_command`); anything else starts cold, as the keeper always does. The trial
child sets itself up as a fresh interpreter would be, unwinds to this file's top level, runs
the script as ``__main__`` and ends as a ``multiprocessing`` child does (``warm_trial.py``, beside
this file: the trial's side). The template runs no trial code, so every trial starts from the same clean state.

At its exit, a warm trial lists the modules it imported that the template had not, in
``.trialbus/imports``: the adapter's pool learns from them what the next template preloads
(``services/trial_keeper/warm_pool.py``). Stdlib only, like the keeper.
"""

import gc
import os
import posix
import sys
import time
from stat import S_ISREG

#: Interpreter options a warm trial may carry (the template must be started with the same);
#: ``-X`` and ``-W`` take a value. Others (``-c``, ``-i``, ``-``…) start cold.
FLAGS = frozenset(b"-u -B -O -OO -s -E -b -bb -q -I -P -R".split())
FLAGS_WITH_VALUE = frozenset((b"-X", b"-W"))
#: Open files of these start with a GPU driver initialised (NVIDIA, AMD, DRM render nodes).
GPU_DEVICES = ("/dev/nvidia", "/dev/kfd", "/dev/dri/")
SHELL_BYTES = frozenset(b"|&;<>()$`\\\"'*?[]#~=%{}!\n\r\v\f")  # as the keeper's: these go through /bin/sh
#: Variables that differ from trial to trial, or from experiment to experiment (``NNI_EXP_ID``: a
#: template serves every experiment of the same code, interpreter and environment), never part of
#: a template's environment. Each trial gets its own values.
PER_TRIAL = (
    b"NNI_TRIAL_JOB_ID",
    b"NNI_SYS_DIR",
    b"NNI_OUTPUT_DIR",
    b"NNI_TRIAL_SEQ_ID",
    b"NNI_EXP_ID",
    b"TRIALBUS_ATTEMPT",
    b"TRIALBUS_CHECKPOINT_DIR",
    b"TRIALBUS_ASK_TOKEN",  # per trial, and its experiment's owner (docs/optuna.md)
    b"TRIALBUS_ASK_OWNER",
    b"CUDA_VISIBLE_DEVICES",
    b"CUDA_DEVICE_ORDER",
)  # the last two: GPU placement

keeper_module = None  # trial_keeper, loaded by path at start
trial_module = None  # warm_trial: what a trial child does, loaded by path at start
kept_module = None  # kept.py, loaded by path at start when the spec says "reuse": kept keepers
spec = {}  # type: dict[str, object]
library_fds = ()  # descriptors the preloaded modules hold: every trial keeps them
#: (command, PATH, code directory) → parse_command's answer, found once by the template
plans = {}  # type: dict[tuple[bytes | None, bytes | None, bytes | None], dict[str, object] | None]
#: A request that starts with this is no trial: the names after it (NUL-separated) are modules to
#: import beside the loaded ones (:func:`import_more`); a keeper's settings never start with NUL.
MORE = b"\0preload\0"


class StartTrial(BaseException):
    """Raised in a trial child to unwind the keeper's frames to this file's top level."""

    def __init__(self, plan):
        self.plan = plan


# -- what can start warm ------------------------------------------------------------------


def resolve(program, path, cwd):
    """``program`` (bytes) as ``execvp`` would find it on ``path``: an absolute path, or None."""
    if b"/" in program:
        found = program if program.startswith(b"/") else cwd + b"/" + program
        return os.fsdecode(os.path.normpath(found)) if os.access(found, os.X_OK) else None
    for folder in (path or b"/usr/bin:/bin").split(b":"):
        candidate = (folder or b".") + b"/" + program
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            candidate = candidate if candidate.startswith(b"/") else cwd + b"/" + candidate
            return os.fsdecode(os.path.normpath(candidate))
    return None


def parse_command(command, path, cwd):
    """How ``command`` (bytes, split on whitespace as the keeper splits it) runs Python: a dict
    ``python`` (absolute), ``flags``, and ``script`` or ``module``, with ``args``; None when it
    is any other shape (a shell line, ``python -c``, not Python at all), which starts cold."""
    argv = command.split()
    if len(argv) < 2 or not SHELL_BYTES.isdisjoint(command):
        return None
    name = os.path.basename(argv[0])
    if not (name in (b"python", b"python3") or name.startswith(b"python3.") and name[8:].isdigit()):
        return None
    python = resolve(argv[0], path, cwd)
    if python is None:
        return None
    flags, i = [], 1
    while i < len(argv) and argv[i].startswith(b"-") and argv[i] != b"-m":
        if argv[i] in FLAGS_WITH_VALUE and i + 1 < len(argv):
            flags += argv[i : i + 2]
            i += 2
        elif argv[i] in FLAGS:
            flags.append(argv[i])
            i += 1
        else:
            return None
    plan = {"python": python, "flags": [os.fsdecode(f) for f in flags]}
    if argv[i : i + 1] == [b"-m"]:
        if i + 1 >= len(argv):
            return None
        plan["module"], plan["args"] = os.fsdecode(argv[i + 1]), [os.fsdecode(a) for a in argv[i + 2 :]]
    elif i < len(argv):
        plan["script"], plan["args"] = os.fsdecode(argv[i]), [os.fsdecode(a) for a in argv[i + 1 :]]
    else:
        return None
    return plan


def template_env(env):
    """A trial's environment (bytes → bytes) without what differs per trial: the template's."""
    return {k: v for k, v in env.items() if k not in PER_TRIAL}


# -- the template --------------------------------------------------------------------------


def gpu_touched():
    """The GPU device a descriptor of this process holds, or torch's word that CUDA is
    initialised: after either, a forked child cannot use the GPU. None when neither."""
    for fd in posix.listdir("/proc/self/fd"):
        try:
            target = posix.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith(GPU_DEVICES):
            return target
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "torch.cuda (initialised)"
    return None


def preload(names, code_dir, shim=None):
    """Import ``names`` in order, one top-level package at a time, checking the GPU after each
    package. Returns (loaded, failed, unsafe): unsafe is the package whose import touched a GPU
    (the rest is then not loaded). Never loaded: modules found under ``code_dir`` (the trial's
    own code), and NNI's modules (they read the trial's environment at import) but for our
    ``nni`` shim (``shim``: its folder), which reads it at first use."""
    import ctypes  # noqa: F401 - for warm_trial.set_cmdline, in every trial
    import importlib
    import importlib.util

    loaded, failed = 0, 0
    code_prefix = os.path.realpath(code_dir) + "/"
    shim = shim and os.path.realpath(os.path.join(shim, "nni", "__init__.py"))
    groups = {}
    for name in names:
        groups.setdefault(name.partition(".")[0], []).append(name)
    for top, members in groups.items():
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
        origin = found is not None and (found.origin or (list(found.submodule_search_locations or ()) or [""])[0])
        origin = origin and os.path.realpath(origin)
        if not origin or origin.startswith(code_prefix) or top == "nni" and origin != shim:
            failed += len(members)
            continue
        for name in members:
            if name.startswith("nni.") or name in sys.modules:
                continue
            try:
                importlib.import_module(name)
                loaded += 1
            except BaseException:  # noqa: BLE001 - an import that fails (or exits) is not preloaded
                failed += 1
        if gpu_touched():
            return loaded, failed, top
    return loaded, failed, None


def open_fds():
    return {int(fd) for fd in posix.listdir("/proc/self/fd")}


def serve(requests, answers):
    """Start a keeper per request until EOF, as the keeper's zygote does; before the first fork for
    a trial command, read its script ahead (``warm_trial.read_ahead``: compiled once, not per trial).
    With ``spec["reuse"]``, a keeper whose trial is over takes the next request (``kept.Kept``)."""
    import _signal  # type: ignore[import-not-found]  # no stub in typeshed for signal's C module

    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # keepers are reaped by the kernel
    read = {}  # trial command → when to read it ahead (again): never once done
    kept = kept_module.Kept(requests, answers) if kept_module is not None else None
    while True:
        if kept is not None and not kept.wait():
            continue  # only keepers said something
        head = keeper_module.read_exact(requests, 8)
        if not head:
            if kept is not None:
                kept.drain()
            return 0
        payload = keeper_module.read_exact(requests, int(head))  # parsed by the keeper, after the fork
        if payload.startswith(MORE):  # not a trial: modules to import beside the loaded ones
            if not import_more(payload[len(MORE) :].split(b"\0"), answers):
                if kept is not None:
                    kept.drain()  # its trials' exits are relayed; none forks from it again
                return 3
            continue
        command = setting(payload, b"TRIALBUS_TRIAL_COMMAND") or b""
        if read.get(command, 0.0) <= time.monotonic():
            key = (command, setting(payload, b"PATH"), setting(payload, b"TRIALBUS_CODE_DIR"))  # as fork_trial's
            plan = plans[key] = parse_command(*key) if key[2] else None
            done = plan is None or trial_module.read_ahead(plan)  # in the code directory: the trial's too
            read[command] = float("inf") if done else time.monotonic() + 0.1
        # This request's objects: a keeper's collections never visit them (nor copy their pages).
        # Frozen objects are never collected here, which costs nothing: a request leaves no cycles.
        gc.freeze()
        try:
            if kept is None:
                pid = keeper_module.fork_keeper(payload, close_fds=(requests, answers))
            else:
                pid = kept.hand(payload) or kept.fork(payload)
        except OSError as exc:
            posix.write(answers, b"error %s\n" % str(exc).encode("utf-8", "replace"))
            continue
        posix.write(answers, b"%d\n" % pid)


def import_more(names, answers):
    """Import ``names`` (bytes) beside the loaded modules, as at the start (:func:`preload`), and
    answer ``ready <loaded> <failed>`` again: what the trials of this template imported beyond
    it (the pool's learning), at the cost of those modules alone, where a new template would
    import everything again. False, having answered ``unsafe <package>``, when an import touched a
    GPU: no trial may fork from this process any more."""
    global library_fds
    before = open_fds()
    loaded, failed, unsafe = preload([os.fsdecode(n) for n in names if n], spec["code_dir"], spec.get("shim"))
    if unsafe:
        posix.write(answers, b"unsafe %s\n" % unsafe.encode())
        return False
    library_fds = tuple(sorted(set(library_fds) | (open_fds() - before)))
    trial_module.TEMPLATE_MODULES = frozenset(sys.modules).difference(("_trialbus_keeper",))
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()
    trim()
    posix.write(answers, b"ready %d %d\n" % (loaded, failed))
    return True


def trim():
    """Give the C heap's free memory back to the system (what imports and compiles left): every
    fork copies, and every exit unmaps, what the template holds. glibc only; elsewhere a no-op."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def setting(payload, name):
    """The value of ``name`` in a request (``KEY=VALUE`` items separated by NUL), the rest left
    unparsed; None when it is not there."""
    key = name + b"="
    if payload.startswith(key):
        start = len(key)
    else:
        found = payload.find(b"\0" + key)
        if found < 0:
            return None
        start = found + 1 + len(key)
    end = payload.find(b"\0", start)
    return payload[start:] if end < 0 else payload[start:end]


def load(name, path):
    """The module in file ``path``, under a private ``name`` (nothing a trial imports clashes)."""
    import importlib.util

    found = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    found.loader.exec_module(module)
    return module


def start_template(keeper_path, spec_path):
    """Load the keeper, move the channels, preload, answer; then serve. The exit status."""
    global keeper_module, trial_module, kept_module, spec, library_fds
    import json

    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == here:
        del sys.path[0]  # a trial does not see this file's folder
    requests, answers = posix.dup(0), posix.dup(1)  # close-on-exec, off the standard descriptors
    null = posix.open("/dev/null", posix.O_RDONLY)
    posix.dup2(null, 0)
    posix.close(null)
    posix.dup2(2, 1)  # an import's prints go to the template's log
    with open(spec_path, encoding="utf-8") as file:
        spec = json.load(file)
    for name in spec.get("unset", ()):  # set by the pool for this process only (LD_BIND_NOW)
        os.environ.pop(name, None)
    keeper_module = load("_trialbus_keeper", keeper_path)
    trial_module = load("_trialbus_warm_trial", os.path.join(here, "warm_trial.py"))
    keeper_module.Keeper.fork_trial = fork_trial
    if spec.get("reuse"):  # keepers kept for trial after trial, which ask this process to fork their trials
        kept_module = load("_trialbus_kept", os.path.join(here, "kept.py"))
        kept_module.template = sys.modules[__name__]
        keeper_module.Keeper.reusable = True
    before = open_fds()
    loaded, failed, unsafe = preload(spec.get("preload", ()), spec["code_dir"], spec.get("shim"))
    if unsafe:
        posix.write(answers, b"unsafe %s\n" % unsafe.encode())
        return 3
    library_fds = tuple(sorted(open_fds() - before))
    trial_module.ARG_AREA = trial_module.arg_area()
    trial_module.TEMPLATE_MODULES = frozenset(sys.modules).difference(("_trialbus_keeper",))  # as a trial has them
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()  # a trial's collections leave the template's objects (and their pages) alone
    trim()
    posix.write(answers, b"ready %d %d\n" % (loaded, failed))
    return serve(requests, answers)


# -- a trial -------------------------------------------------------------------------------


def fork_trial(keeper, out_w, env):
    """``Keeper.fork_trial``: fork the trial (environment ``env``) from this process (a keeper
    forked from the template); the child's pid, or 0 when the command cannot start warm (the
    keeper then spawns it cold). In the child this never returns: it raises :class:`StartTrial`."""
    key = (keeper.command, env.get(b"PATH"), keeper.code_dir.encode("utf-8", "surrogateescape"))
    plan = plans[key] if key in plans else parse_command(*key)
    if plan is None or plan["python"] != spec["python"] or plan["flags"] != spec["flags"]:
        return 0
    if "script" in plan:
        try:
            stat = posix.stat(plan["script"])
        except OSError:
            return 0  # nothing there: as cold Python says
        if not S_ISREG(stat.st_mode):
            return 0  # a directory or zip to run
        plan = dict(plan, stat=stat)  # which file the trial runs (what the template read ahead may be)
    if kept_module is not None and kept_module.channel is not None:  # a kept keeper: the template forks it
        return kept_module.request(keeper, out_w, env)
    stderr = keeper.path("stderr")
    gc.freeze()  # what the keeper made so far: the trial's collections never visit it (nor copy its pages)
    pid = posix.fork()
    if pid:
        return pid
    try:
        trial_module.become_trial(plan, env, out_w, stderr, keeper.dir, library_fds)
    except BaseException as exc:  # noqa: BLE001 - never run keeper code in the trial: start it cold
        trial_module.cold(plan, env, exc, keeper.dir)
    raise StartTrial(plan)


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: trial_template.py <trial_keeper.py> <spec.json>\n")
        return 2
    try:
        return start_template(sys.argv[1], sys.argv[2])
    except StartTrial as start:  # in a trial child, the keeper's frames unwound
        plan = start.plan
    try:
        status = trial_module.run_trial(plan)
    except SystemExit as exc:  # as the interpreter reads it
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, (int, type(None))):
            sys.stderr.write("%s\n" % (exc.code,))
    trial_module.finish(status)


if __name__ == "__main__":
    sys.exit(main())
