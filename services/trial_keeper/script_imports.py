"""A trial script's imports, read from its source without running it: what an experiment's first
warm template preloads (``warm_pool.WarmPool.template_for``). Stdlib only (Python 3.9+), shipped
beside ``warm_pool.py``.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path


def script_imports(code_dir: str, plan: dict, limit: int = 20) -> set[str]:
    """The modules a trial's script imports outside its functions and classes, read from its
    source without running it, and those of the code directory's own modules it imports (up to
    ``limit`` files): the first guess of what its template preloads, before any trial has run.
    ``from a.b import c`` names ``a.b`` and ``a.b.c`` (a submodule or not: a name that is no
    module just fails to preload)."""
    target = plan.get("script") or plan["module"].replace(".", "/") + ".py"
    queue, seen, found = [os.path.join(code_dir, target)], set(), set()  # type: list[str], set[str], set[str]
    while queue and len(seen) < limit:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            body = ast.parse(Path(path).read_bytes()).body
        except (OSError, SyntaxError, ValueError):
            continue
        while body:
            node = body.pop()
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")]
            else:
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    body += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
                continue
            for name in names:
                local = os.path.join(code_dir, *name.split("."))
                for candidate in (local + ".py", os.path.join(local, "__init__.py")):
                    if os.path.isfile(candidate):
                        queue.append(candidate)  # the trial's own module: read it, never preload it
                found.add(name)
    return found
