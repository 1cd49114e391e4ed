"""How the ``nni`` stand-in hands everything but the trial API to the real package (see ``nni.__doc__``).

Imported on first need only. The real package's ``__init__`` runs into a module of its own
(``__name__`` and ``__package__`` ``"nni"``, ``__path__`` the real directory) that is never in
``sys.modules``: ``sys.modules["nni"]`` stays the stand-in, whose ``__path__`` leads to the real
submodules, so the real code's ``from .x import y`` and ``import nni`` find the same modules as
everyone else's, and ``nni.trace`` reaches the real module through the stand-in's ``__getattr__``.

Order is what makes this safe. Imported on its own, NNI's ``__init__`` runs before any of its
submodules, and some of them rely on it (``from nni import NoMoreTrialError`` in
``nni.runtime.msg_dispatcher``, ``@nni.trace`` at class definition in ``nni.nas``). So until the
real package has loaded, the stand-in's finder (``nni._PackageFirst``) gives every ``nni.*``
submodule a loader that runs the package's ``__init__`` first (:class:`AfterPackage`); the
submodule may be loaded by then, and is then left as it is.

Threads: the package loads under Python's own import lock for ``nni`` (:class:`_PackageLock`).
As with any package, several threads that import its submodules for the first time at once can
meet Python's concurrent-import errors; NNI's own import avoids them by running first, in one thread.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

    from . import _Channel, _TrialEnv

#: CPython's importlib._bootstrap (None elsewhere): its private _get_module_lock and _DeadlockError have no stubs.
_bootstrap: Any = sys.modules.get("_frozen_importlib")


class _Shim(Protocol):
    """The stand-in module's names that the handover reads and sets (``nni/__init__.py``)."""

    #: The real package's module (NNI has no type information), from when its ``__init__`` starts.
    _real: Any
    _real_ready: bool
    _real_spec: ModuleSpec | None
    #: The stand-in's ``_TrialState``, then the real ``nni.trial`` module (untyped, as NNI is).
    _state: Any
    _trial_env: _TrialEnv | None
    _get_channel: Callable[[], _Channel]

    def _default_channel(self) -> _Channel: ...


def _names(shim: ModuleType) -> _Shim:
    """The stand-in module as what it holds (a module object cannot be declared as the protocol it meets)."""
    return cast("_Shim", shim)


class _PackageLock:
    """Python's own import lock for the name ``nni``: a second thread waits while the package loads; a
    thread whose wait would close a cycle (it holds a submodule's lock that the loading thread needs)
    goes on with the package as loaded so far, as Python does in a concurrent circular import."""

    def __init__(self) -> None:
        get_lock = getattr(_bootstrap, "_get_module_lock", None)  # absent outside CPython: no lock then
        self.lock = get_lock("nni") if get_lock is not None else None
        self.held = False

    def __enter__(self) -> None:
        if self.lock is not None:
            with contextlib.suppress(_bootstrap._DeadlockError):
                self.held = self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        if self.held and self.lock is not None:  # (held: the lock was there)
            self.lock.release()


def load_package(module: ModuleType) -> Any:
    """The real package's module, its ``__init__`` run — or running, when this thread is the one
    running it (a submodule it imports asks for ``nni.x``): then the names bound so far (untyped, as
    NNI is)."""
    shim = _names(module)
    if shim._real_ready:
        return shim._real
    with _PackageLock():
        if shim._real is not None:
            return shim._real
        spec = shim._real_spec
        # Asked for only with a real package found (the stand-in's __getattr__ and finder check), whose spec
        # has a loader (a directory's, from PathFinder).
        assert spec is not None and spec.loader is not None
        real = importlib.util.module_from_spec(spec)
        shim._real = real
        try:
            spec.loader.exec_module(real)
        except BaseException:
            shim._real = None  # as a failed import: the next use tries again
            raise
        try:
            _adopt_trial_api(shim)
        finally:
            shim._real_ready = True
            for finder in [f for f in sys.meta_path if getattr(f, "trialbus_nni", False)]:
                sys.meta_path.remove(finder)
    return real


def _adopt_trial_api(shim: _Shim) -> None:
    """Move the trial API's state into the real ``nni.trial`` and make the stand-in's channel NNI's
    default, so the stand-in, ``nni.trial`` and NNI code that swaps the channel share one state."""
    trial: Any = sys.modules.get("nni.trial")  # NNI's module, whose private names are set here
    if trial is None:
        return  # NNI's dispatcher (SDK_PROCESS=dispatcher) loads no trial API
    trial._params = shim._state._params
    trial._intermediate_seq = shim._state._intermediate_seq
    env = shim._trial_env
    if env is not None:  # what the trial API answered so far (NNI read its own copy at its import)
        trial._experiment_id, trial._trial_id, trial._sequence_id = env.experiment_id, env.trial_id, env.sequence_id
    shim._state = trial
    try:
        from nni.runtime import trial_command_channel as channels
    except ImportError:  # before NNI 3.0: no channel to share; the stand-in keeps its own
        return
    own = shim._default_channel()
    own.__class__ = type("TrialbusTrialCommandChannel", (type(own), channels.TrialCommandChannel), {})
    if channels._channel is None:
        channels.set_default_trial_command_channel(own)
    shim._get_channel = channels.get_default_trial_command_channel


def real_version(module: ModuleType) -> str:
    """The real package's ``__version__``: from its ``version.py`` while the package is not loaded
    (where NNI's ``__init__`` takes it from), so asking costs no import."""
    shim = _names(module)
    if shim._real_ready:
        return shim._real.__version__
    # Asked for only with a real package found, a directory (_find_real checked)
    assert shim._real_spec is not None and shim._real_spec.submodule_search_locations
    folder = shim._real_spec.submodule_search_locations[0]
    namespace: dict[str, object] = {}
    try:
        with open(f"{folder}/version.py", encoding="utf-8") as file:
            exec(compile(file.read(), file.name, "exec"), namespace)  # the package's own code, as its import runs it
    except OSError:  # none (the version is set elsewhere), or not in a plain directory: ask the package
        return load_package(module).__version__
    return str(namespace.get("__version__", "999.dev0"))


def find_submodule(
    finder: object, name: str, path: Sequence[str] | None, target: ModuleType | None
) -> ModuleSpec | None:
    """``nni.<name>``'s spec from the finders after ``finder``, its loader wrapped in
    :class:`AfterPackage` while the real package has not loaded."""
    shim = sys.modules.get("nni")
    if shim is None or getattr(shim, "_real_ready", True):
        return None
    for other in sys.meta_path:
        find_spec = getattr(other, "find_spec", None)
        if other is finder or find_spec is None:
            continue
        spec = find_spec(name, path, target)
        if spec is not None:
            break
    else:
        return None
    if spec.loader is not None:
        spec.loader = AfterPackage(spec.loader, shim)
    return spec


class AfterPackage:
    """A real submodule's loader that first runs the real package's ``__init__``. That may import the
    submodule itself: then it is the module the import gets, not run a second time."""

    def __init__(self, loader: Loader, shim: ModuleType) -> None:
        self.loader, self.shim = loader, shim
        self.loaded: ModuleType | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        load_package(self.shim)
        self.loaded = sys.modules.get(spec.name)
        if self.loaded is not None:
            self.spec = self.loaded.__spec__  # the import system sets ours on it next; exec_module puts it back
            return self.loaded
        spec.loader = self.loader  # from here on the module's own loader does the rest
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Reached only for a submodule that the package's __init__ loaded (its loader runs the others).
        module.__spec__ = self.spec

    def __getattr__(self, name: str) -> object:  # get_code, get_source… (runpy): the package first too
        if name in ("loader", "shim", "spec"):
            raise AttributeError(name)
        load_package(self.shim)
        return getattr(self.loader, name)
