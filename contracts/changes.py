"""How a change to a running experiment reads for people, in one line: the dispatcher's log and
audit trail and ``trialbus update`` say it the same way (``trialConcurrency 2 → 4``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: A search space parameter's spec is cut to this many characters in a line.
SPEC_WIDTH = 60


def change_line(name: str, old: Any, new: Any) -> str:
    """``trialConcurrency 2 → 4``; a search space by the parameters that changed:
    ``searchSpace x: uniform [0, 1] → uniform [2, 3]; +momentum``. O(parameters)."""
    if name == "searchSpace":
        return f"searchSpace {space_change(old, new)}"
    return f"{name} {shown(old)} → {shown(new)}"


def space_change(old: Any, new: Any) -> str:
    before = old if isinstance(old, Mapping) else {}
    after = new if isinstance(new, Mapping) else {}
    parts = [f"+{name}" for name in after if name not in before]
    parts += [f"-{name}" for name in before if name not in after]
    parts += [
        f"{name}: {_spec(before[name])} → {_spec(after[name])}"
        for name in after
        if name in before and before[name] != after[name]
    ]
    return "; ".join(parts) or "unchanged"


def shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, Mapping):
        return "{" + ", ".join(sorted(map(str, value))) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _spec(spec: Any) -> str:
    if isinstance(spec, Mapping) and "_type" in spec:
        text = f"{spec['_type']} {json.dumps(spec.get('_value'), separators=(', ', ': '))}"
    else:
        text = json.dumps(spec, separators=(", ", ": "))
    return text if len(text) <= SPEC_WIDTH else text[: SPEC_WIDTH - 1] + "…"
