"""PATCH bodies: JSON Patch (RFC 6902) and JSON merge patch (RFC 7386), as the apiserver applies them.

A custom resource accepts ``application/json-patch+json`` and ``application/merge-patch+json``;
strategic merge patch needs Go struct tags a CRD does not have, so it answers 415 (B.1). A JSON
Patch that cannot apply (a failed ``test``, a missing path) is 422 Invalid, as upstream.
"""

from __future__ import annotations

import copy
from typing import Any

from . import status

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class PatchError(Exception):
    """The patch does not apply; the caller answers 422 with this message."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts[:-1]:
        doc = _child(doc, part, path)
    return doc


def _child(doc: Any, part: str, path: str) -> Any:
    if isinstance(doc, dict) and part in doc:
        return doc[part]
    if isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
        return doc[int(part)]
    raise PatchError(f"doc is missing path: {path!r}")


def _index(container: list[Any], part: str, path: str, insert: bool) -> int:
    if part == "-" and insert:
        return len(container)
    if not part.isdigit() or int(part) > len(container) - (0 if insert else 1):
        raise PatchError(f"unable to access invalid index {part!r} in {path!r}")
    return int(part)


def _get(doc: Any, path: str) -> Any:
    value = doc
    for part in _pointer(path):
        value = _child(value, part, path)
    return value


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if parts[-1] not in parent:
            raise PatchError(f"unable to remove nonexistent key: {parts[-1]}: missing value")
        return parent.pop(parts[-1])
    if isinstance(parent, list):
        return parent.pop(_index(parent, parts[-1], path, insert=False))
    raise PatchError(f"doc is missing path: {path!r}")


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if replace and parts[-1] not in parent:
            raise PatchError(f"replace operation does not apply: doc is missing key: {path}: missing value")
        parent[parts[-1]] = value
    elif isinstance(parent, list):
        index = _index(parent, parts[-1], path, insert=not replace)
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    else:
        raise PatchError(f"doc is missing path: {path!r}")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 on a copy of ``target``; raises ``PatchError`` when an operation does not apply."""
    if not isinstance(operations, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "path" not in op:
            raise PatchError(f"invalid operation {op!r}")
        kind, path = op.get("op"), op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"missing value for {kind} operation")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("move", "copy"):
            if "from" not in op:
                raise PatchError(f"missing from for {kind} operation")
            value = _remove(doc, op["from"]) if kind == "move" else copy.deepcopy(_get(doc, op["from"]))
            doc = _add(doc, path, value)
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except PatchError:
                raise PatchError(f"testing value {path} failed: missing value") from None
            if actual != op["value"]:
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}")
    return doc


def apply(content_type: str, target: dict[str, Any], body: Any, strategic_as_merge: bool = False) -> Any:
    """The patched copy of ``target`` for a PATCH with this ``Content-Type`` (parameters ignored)."""
    media = content_type.split(";")[0].strip().lower()
    if media == STRATEGIC_MERGE_PATCH and strategic_as_merge:
        media = MERGE_PATCH  # a Secret's fields are all maps or scalars: strategic merge is merge there
    if media == JSON_PATCH:
        return json_patch(target, body)
    if media == MERGE_PATCH:
        return merge_patch(target, body)
    raise status.unsupported_patch()
