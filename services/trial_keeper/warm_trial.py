"""The trial side of a warm start: what a child forked from a trial template (``trial_template.py``)
does to become the trial a cold ``python X.py`` would have been, to run it, and to end.

The template loads this file by path (as ``_trialbus_warm_trial``) before it preloads anything;
the functions run only in a trial child, after the fork. Stdlib only (Python 3.9+), like the keeper.
"""

import atexit
import os
import posix
import sys
import time
from importlib.machinery import SourceFileLoader
from types import ModuleType

#: What the template read ahead for its trials (:func:`read_ahead`): path → (the file's identity
#: then, what was read). A trial uses an entry only while its file is still that file.
READ_AHEAD = {}  # type: dict[str, tuple[tuple[int, int, int, int], object]]
#: Nanoseconds: a file changed this recently is not read ahead. A change within the same clock
#: tick as the template's read would leave its change time as it was; changes after this
#: margin always move it on.
RACY = 50_000_000
#: (start, end) of this process's argument area, the same in every forked child: set by the template.
ARG_AREA = None
#: The modules the template has loaded (set by it, once): what a trial imports beyond them is learned.
TEMPLATE_MODULES = None
#: In a trial: its parent as it started (the template, or its keeper) and its directory. Its parent
#: gone at its end, the trial writes its exit status in ``.trialbus/exit`` (``finish``): a
#: template that forked the trial for a kept keeper passes the status on, and took it along.
PARENT = 0
TRIAL_DIR = None


def become_trial(plan, env, out_w, stderr, trial_dir, library_fds):
    """In the trial child: the process a cold start would have made, short of the script."""
    import _signal  # type: ignore[import-not-found]  # no stub in typeshed for signal's C module

    global PARENT, TRIAL_DIR

    PARENT, TRIAL_DIR = posix.getppid(), trial_dir
    _signal.set_wakeup_fd(-1)
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    posix.setsid()  # the trial leads its own group, which the keeper's killpg reaches
    null = posix.open("/dev/null", posix.O_RDONLY)
    err = posix.open(stderr, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o644)
    posix.dup2(null, 0)
    posix.dup2(out_w, 1)
    posix.dup2(err, 2)
    keep = sorted({0, 1, 2, *library_fds})
    for i, low in enumerate(keep):  # (Python 3.9 on remote machines: no zip(strict=))
        high = keep[i + 1] if i + 1 < len(keep) else posix.sysconf("SC_OPEN_MAX")
        if high > low + 1:
            posix.closerange(low + 1, high)  # the keeper's and the template's: none reaches the trial
    # The template's environment is the trial's but for a few per-trial values (and what its
    # imports set). os.environ and os.environb share this dict of bytes; changed as they change it.
    current = os.environ._data
    for name in [name for name in current if name not in env]:
        posix.unsetenv(name)
        del current[name]
    for name, value in env.items():
        if current.get(name) != value:
            posix.putenv(name, value)
            current[name] = value
    cwd = posix.getcwd()
    if "module" in plan:
        sys.argv, path0 = ["-m", *plan["args"]], cwd
        sys.orig_argv = [plan["python"], *plan["flags"], "-m", plan["module"], *plan["args"]]
    else:
        sys.argv, path0 = [plan["script"], *plan["args"]], script(script_path(plan), plan["stat"])[1]
        sys.orig_argv = [plan["python"], *plan["flags"], *sys.argv]
    if not (sys.flags.isolated or getattr(sys.flags, "safe_path", False)):
        modules = sys.modules  # looked up name by name: iterating it would touch (copy) every entry's page
        shadowed = [name for name in module_names(path0) if name in modules]
        if shadowed:  # the trial's own module of that name would win over the loaded one: cold
            raise ImportError("%s/ shadows the loaded module %s" % (path0, sorted(shadowed)[0]))
        sys.path.insert(0, path0)
    sys.modules.pop("_trialbus_keeper", None)
    set_cmdline([os.fsencode(a) for a in sys.orig_argv])
    # `random` reseeds itself at fork; numpy's and torch's global generators do not (a cold
    # start seeds both from the OS), so each trial's streams would be its siblings'.
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if getattr(torch, "default_generator", None) is not None:
        torch.default_generator.seed()
    record_imports(trial_dir, TEMPLATE_MODULES or frozenset(sys.modules))


def arg_area():
    """(start, end) of this process's original argument area, from ``/proc/self/stat``."""
    with open("/proc/self/stat", "rb") as file:
        fields = file.read().rpartition(b")")[2].split()
    return int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)


def set_cmdline(argv):
    """Show ``argv`` in ``/proc/<pid>/cmdline`` (``ps``, ``top``) instead of the template's own:
    written over the process's original argument area, as setproctitle does; cut to its size."""
    import ctypes

    start, end = ARG_AREA or arg_area()
    data = b"\0".join(argv)[: end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


# -- read ahead in the template -------------------------------------------------------------


def identity(stat):
    """Which file this is, as of which change: its change time (which no one can set back,
    unlike the modification time), size and inode."""
    return stat.st_ctime_ns, stat.st_size, stat.st_ino, stat.st_dev


def recall(path, stat):
    """What the template read of ``path`` (stat ``stat`` now), or None: never read, or changed since."""
    found = READ_AHEAD.get(path)
    return found[1] if found is not None and found[0] == identity(stat) else None


def remember(path, stat, value):
    """Keep ``value`` read from ``path`` (stat ``stat`` before the read) for the trials; False
    when the file changed too recently to tell a later change from this one by its change time."""
    if stat.st_ctime_ns > time.time_ns() - RACY:
        return False
    READ_AHEAD[path] = (identity(stat), value)
    return True


def module_names(folder):
    """The names importable from ``folder`` as top-level modules or packages (a superset)."""
    stat = posix.stat(folder)
    names = recall(folder, stat)
    if names is None:
        names = frozenset(n[:-3] if n.endswith(".py") else n for n in posix.listdir(folder) if not n.startswith("__"))
        remember(folder, stat, names)
    return names


def script_path(plan):
    """The absolute path of the plan's script (relative to the working directory, the code's)."""
    return plan["script"] if plan["script"].startswith("/") else posix.getcwd() + "/" + plan["script"]


def script(filename, stat):
    """``(code, folder)``: the script ``filename`` (whose stat is ``stat``) compiled as ``python
    X.py`` compiles it, and the folder of its real path (``sys.path[0]``); read ahead by the
    template while the file is unchanged."""
    found = recall(filename, stat)
    if found is None:
        with open(filename, "rb") as file:
            source = file.read()
        found = compile(source, filename, "exec", dont_inherit=True), os.path.dirname(os.path.realpath(filename))
        remember(filename, stat, found)
    return found


def read_ahead(plan):
    """In the template, before its first trial of ``plan`` forks: compile the script and list its
    folder once for all of them. False when some of it changed too recently to keep (try later)."""
    if "script" not in plan:
        return True
    filename = script_path(plan)
    try:
        folder = script(filename, posix.stat(filename))[1]
        module_names(folder)
        return all(recall(path, posix.stat(path)) is not None for path in (filename, folder))
    except (OSError, SyntaxError, ValueError):
        return True  # each trial reads it and fails as cold Python would


def cold(plan, env, exc, trial_dir):
    """The child could not become the trial: run the command cold in its place (same pid, the
    keeper's child), saying why in the keeper's log; if even that fails, exit 127 as a shell
    would."""
    try:
        line = "%s trial_template: starting the trial cold: %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), exc)
        log = posix.open(trial_dir + "/.trialbus/keeper.log", posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND, 0o644)
        posix.write(log, line.encode("utf-8", "replace"))
        posix.close(log)
    except OSError:
        pass
    try:
        target = ["-m", plan["module"]] if "module" in plan else [plan["script"]]
        posix.execve(plan["python"], [plan["python"], *plan["flags"], *target, *plan["args"]], env)
    finally:
        posix._exit(127)


def record_imports(trial_dir, before):
    """At exit, list in ``.trialbus/imports`` what this trial imported beyond the template,
    minus its own code: what the next template may preload."""

    def write():
        if len(sys.modules) <= len(before):
            return  # nothing new (or so little that missing it costs a later trial a few imports)
        code = os.path.realpath(posix.getcwd()) + "/"
        names = []
        for name in set(sys.modules) - before:
            module = sys.modules.get(name)
            where = getattr(module, "__file__", None) or ""
            if name != "__main__" and module is not None and not os.path.realpath(where or "/").startswith(code):
                names.append(name)
        if names:
            with open(trial_dir + "/.trialbus/imports", "w", encoding="utf-8") as file:
                file.write("\n".join(sorted(names)) + "\n")

    atexit.register(write)  # registered first, so it runs last: after the trial's own handlers


def run_trial(plan):
    """Run the trial's script or module as ``__main__``, as ``python X.py`` / ``python -m``
    would; an uncaught exception is printed as cold Python prints it (without this file's frames)."""
    try:
        if "module" in plan:
            import runpy

            runpy._run_module_as_main(plan["module"], alter_argv=True)
        else:
            filename = script_path(plan)
            main = sys.modules["__main__"] = ModuleType("__main__")
            main.__file__, main.__cached__ = filename, None
            main.__loader__ = SourceFileLoader("__main__", filename)
            exec(script(filename, plan.get("stat") or posix.stat(filename))[0], main.__dict__)  # noqa: S102
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # as cold Python prints it: no frame of this file
        exc.with_traceback(tb)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):  # as cold Python: die of SIGINT
            import _signal

            sys.stdout.flush()
            sys.stderr.flush()
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
            posix.kill(posix.getpid(), _signal.SIGINT)
        return 1
    return 0


def finish(status):
    """End the trial as a fork child of ``multiprocessing`` ends: wait for its threads, run its
    ``atexit`` handlers, flush every file it opened, then exit without tearing the modules down.
    The teardown is what costs (~0.2 s of CPU once scikit-learn is loaded, for nothing: the
    process is gone after it); what it would do for a trial is done here, but for ``__del__`` of
    objects still alive at exit, which Python does not promise to run anyway."""
    import gc
    import io

    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
    except BaseException:  # noqa: BLE001 - a Ctrl-C while waiting: exit as Python would, now
        pass
    atexit._run_exitfuncs()
    # The template froze its own objects: gc.get_objects() lists only what the trial made.
    files = [obj for obj in gc.get_objects() if isinstance(obj, io.IOBase)]
    for kind in (io.TextIOBase, io.BufferedIOBase):  # text layers first: they write into buffers
        for file in files:
            if isinstance(file, kind):
                try:
                    file.flush()
                except (OSError, ValueError):
                    pass  # closed, or a broken pipe: as the interpreter, say nothing
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if TRIAL_DIR and posix.getppid() != PARENT:  # its parent is gone: say the status where the keeper looks
        try:
            fd = posix.open(TRIAL_DIR + "/.trialbus/exit", posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o644)
            posix.write(fd, b"%d\n" % (status & 0xFF))
            posix.close(fd)
        except OSError:
            pass
    posix._exit(status & 0xFF)
