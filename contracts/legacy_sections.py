"""How one section of NNI's v1 config becomes v2 keys: each v1 key is moved (renamed as NNI's
converter renames it), accepted with no effect, refused with the reason, or handled by the
caller; any other key is refused, naming it. :mod:`contracts.legacy` and
:mod:`contracts.legacy_platforms` describe their sections with :class:`Keys`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Where every v1 key and what it becomes are listed, for error messages.
DOCS = "docs/nni-v1.md"


@dataclass(frozen=True)
class Keys:
    """The keys of one v1 section. A key in none of these is unknown (refused, named)."""

    #: v1 key → v2 key; a null value is left out, as NNI's ``_move_field`` leaves it.
    moved: Mapping[str, str] = field(default_factory=dict)
    #: Accepted and dropped: they change nothing here (docs/nni-v1.md says why for each).
    no_effect: frozenset[str] = frozenset()
    #: v1 key → why it is refused, whatever its value.
    refused: Mapping[str, str] = field(default_factory=dict)
    #: v1 key → (whether a value is refused, why); other values are moved or have no effect.
    refused_if: Mapping[str, tuple[Callable[[Any], bool], str]] = field(default_factory=dict)
    #: Read by the caller (nested sections, keys whose conversion needs several keys).
    nested: frozenset[str] = frozenset()

    @property
    def known(self) -> set[str]:
        return {*self.moved, *self.no_effect, *self.refused, *self.refused_if, *self.nested}


def mapping(value: Any, where: str, problems: list[str]) -> dict[str, Any]:
    """``value`` when it is a mapping (an absent or null section is empty); else a problem."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where}: must be a mapping, not {type(value).__name__}")
        return {}
    return value


def convert(section: Any, where: str, keys: Keys, problems: list[str]) -> dict[str, Any]:
    """The v2 keys of the v1 ``section`` at ``where`` (a dotted path; empty at the top). Each
    refused or unknown key is added to ``problems`` as ``"<path>: <why>"``; the caller raises."""
    out: dict[str, Any] = {}
    for key, value in mapping(section, where, problems).items():
        path = f"{where}.{key}" if where else str(key)
        if key in keys.refused:
            problems.append(f"{path}: {keys.refused[key]}")
        elif key in keys.refused_if and keys.refused_if[key][0](value):
            problems.append(f"{path}: {keys.refused_if[key][1]}")
        elif key in keys.moved:
            if value is not None:
                out[keys.moved[key]] = value
        elif key not in keys.known:
            problems.append(f"{path}: {unknown(str(key), keys)}")
    return out


def unknown(key: str, keys: Keys) -> str:
    """Why ``key`` is refused, with the v1 key the user probably meant."""
    v1_of = {v2: v1 for v1, v2 in keys.moved.items() if v1 != v2}
    if key in v1_of:
        return (
            f"the v2 name of {v1_of[key]}; a file with trainingServicePlatform is read as NNI's v1 layout: "
            f"write {v1_of[key]}, or convert the whole file to v2"
        )
    canonical = {k.lower().replace("_", ""): k for k in keys.known}
    near = canonical.get(key.lower().replace("_", ""))
    if near is not None:
        return f"unknown key; v1 keys are spelled exactly: {near}"
    if len(keys.known) <= 12:
        return f"not a key of NNI's v1 layout here (this section takes {', '.join(sorted(keys.known))})"
    return f"not a key of NNI's v1 layout ({DOCS} lists them)"


def truthy(value: Any) -> bool:
    return bool(value)
