"""A user's tuner, assessor or advisor class, loaded as NNI loads it.

NNI (``nni/tools/package_utils/tuner_factory.py::create_customized_class_instance``) puts ``codeDirectory``
on ``sys.path``, imports the module of ``className`` (``module.Class``; v1's ``codeDir`` + ``classFileName``
+ ``className`` arrive converted to this by :mod:`contracts.legacy`, as NNI converts them) and calls the
class with ``classArgs`` as keyword arguments. So does :func:`load` then :func:`construct`, with two
differences that come from one tuner service running many experiments' classes in one process, where
NNI starts a process per experiment:

* ``codeDirectory`` goes first on ``sys.path`` (NNI appends it), and the modules earlier loads imported
  from code directories are imported again: each experiment gets its own files as they are now (an
  edited tuner is picked up by the next experiment; two experiments' ``my_tuner.py`` do not mix). A
  class already running keeps the module it was loaded with.
* The class must be there, and take its ``classArgs``, before anything runs: a config naming something
  that is not there is a ValueError saying what to fix. What the user's module or constructor raises is a
  :class:`~services.tuner.protocol.ClassFailed` with the user's traceback.

The ``nni`` package is needed only where a class imports it (``pip install 'trialbus[nni]'``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from services.tuner.calls import failure
from services.tuner.protocol import ClassFailed

__all__ = ["ClassSpec", "construct", "load", "names_class", "spec"]

# sys.path and sys.modules belong to the process: loads take turns, and remember what they imported from code
# directories (module names) so that the next load imports those afresh.
_LOCK = threading.Lock()
_FROM_CODE_DIRECTORIES: set[str] = set()


def names_class(config: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    """Whether a tuner, assessor or advisor config names a class (``className``) rather than a built-in name."""
    return config is not None and any(str(k).lower() == "classname" for k in config)


@dataclass(frozen=True)
class ClassSpec:
    """A config's class, checked for shape (nothing imported yet)."""

    kind: str  # "tuner", "assessor" or "advisor": the config section
    class_name: str  # module.Class
    code_directory: Path | None
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def owner(self) -> str:
        """How messages name it: ``tuner class my_tuner.MyTuner``."""
        return f"{self.kind} class {self.class_name}"

    @property
    def module(self) -> str:
        return self.class_name.rpartition(".")[0]


def spec(config: Mapping[str, Any], kind: str) -> ClassSpec:
    """The class a ``{className, codeDirectory, classArgs}`` section names; ValueError naming the key at fault."""
    keys = {str(k).lower(): v for k, v in config.items()}
    class_name, code_dir, args = keys.get("classname"), keys.get("codedirectory"), keys.get("classargs") or {}
    if keys.get("name") is not None:
        raise ValueError(
            f"{kind} has both name ({keys['name']}) and className ({class_name}): a built-in name, "
            "or a class of yours, not both"
        )
    if not isinstance(class_name, str) or "." not in class_name.strip(".") or class_name != class_name.strip():
        raise ValueError(
            f"{kind}.className must be 'module.ClassName' (the class ClassName in module.py of "
            f"{kind}.codeDirectory), got {class_name!r}"
        )
    if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
        raise ValueError(f"{kind}.classArgs must be an object of keyword arguments for {class_name}, got {args!r}")
    if code_dir is not None and not isinstance(code_dir, str):
        raise ValueError(f"{kind}.codeDirectory must be a folder path, got {code_dir!r}")
    folder = Path(code_dir).expanduser().resolve() if code_dir is not None else None
    return ClassSpec(kind, class_name, folder, dict(args))


def load(spec: ClassSpec) -> type:
    """The class, its module imported afresh from ``codeDirectory``, checked to take ``classArgs``.

    :raises ValueError: no such folder, module or class, or classArgs the class does not take.
    :raises ClassFailed: the module raised while it was imported.
    """
    folder = spec.code_directory
    if folder is not None and not folder.is_dir():
        raise ValueError(
            f"{spec.kind}.codeDirectory {folder} is not a folder the tuner service can read "
            f"(it holds {spec.module.replace('.', '/')}.py for {spec.class_name}; the tuner "
            "service reads it where it runs)"
        )
    module = _import(spec, folder)
    attribute = spec.class_name.rpartition(".")[2]
    cls = getattr(module, attribute, None)
    if not isinstance(cls, type):
        where = getattr(module, "__file__", None) or spec.module
        defined = sorted(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        what = "has no class" if cls is None else "has something that is not a class named"
        raise ValueError(
            f"{spec.kind}.className {spec.class_name}: {where} {what} {attribute}; "
            f"it defines {', '.join(defined) or 'no class'}"
        )
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to read (a class implemented in C): its call will say
        return cls
    try:
        signature.bind(**spec.args)
    except TypeError as exc:
        takes = [n for n, p in signature.parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        raise ValueError(
            f"{spec.kind}.classArgs {spec.args} do not fit {spec.class_name}: {exc}; it takes "
            f"{', '.join(takes) or 'no arguments'}"
        ) from None
    return cls


def construct(spec: ClassSpec, cls: type) -> Any:
    """``cls(**classArgs)``; :class:`ClassFailed` with the constructor's traceback if it raises."""
    try:
        return cls(**spec.args)
    except Exception as exc:
        raise failure(spec.owner, "__init__", exc) from None


def _import(spec: ClassSpec, folder: Path | None) -> Any:
    with _LOCK:
        for name in _FROM_CODE_DIRECTORIES:
            sys.modules.pop(name, None)
        _FROM_CODE_DIRECTORIES.clear()
        if folder is not None:
            with_folder = [p for p in sys.path if p != str(folder)]
            sys.path[:] = [str(folder), *with_folder]
            importlib.invalidate_caches()
        before = set(sys.modules)
        try:
            return importlib.import_module(spec.module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (spec.module == exc.name or spec.module.startswith(exc.name + ".")):
                if spec.module.split(".")[0] == "nni":
                    where = "where the tuner service runs: pip install 'trialbus[nni]' there"
                elif folder is not None:
                    where = f"in codeDirectory {folder}; it is the file {spec.module.replace('.', '/')}.py there"
                else:
                    where = (
                        f"where the tuner service runs; set {spec.kind}.codeDirectory to the folder holding "
                        f"{spec.module.replace('.', '/')}.py"
                    )
                raise ValueError(
                    f"{spec.kind}.className {spec.class_name}: there is no module {spec.module} {where}"
                ) from None
            hint = " (pip install 'trialbus[nni]' there)" if str(exc.name).split(".")[0] == "nni" else ""
            raise ClassFailed(
                f"{spec.owner} could not be imported: it needs the module {exc.name}, which the tuner "
                f"service does not have{hint}",
                failure(spec.owner, "import", exc).details,
            ) from None
        except Exception as exc:
            raise failure(spec.owner, f"the import of {spec.module}", exc) from None
        finally:
            if folder is not None:
                for name in set(sys.modules) - before:
                    file = getattr(sys.modules.get(name), "__file__", None)
                    if file and Path(file).resolve().is_relative_to(folder):
                        _FROM_CODE_DIRECTORIES.add(name)
