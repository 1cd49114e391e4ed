"""The object store: etcd's part of the apiserver, in memory.

One global ``resourceVersion`` counter orders every write of every resource, as etcd's revision
does. Each write is kept as an ``Event`` in a bounded history, so a watch can resume from any
``resourceVersion`` the history still covers; older ones get 410 Expired, as after an etcd
compaction (``compact()`` forces one). Writes happen on the event loop thread only, so a
subscription taken between two writes misses nothing.
"""

from __future__ import annotations

import asyncio
import copy
import re
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from . import status
from .resources import Resource

HISTORY_LIMIT = 5000
Obj = dict[str, Any]


def timestamp() -> str:
    """RFC 3339 in seconds, UTC, as Kubernetes writes ``creationTimestamp``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    """One write: its resourceVersion, type (ADDED, MODIFIED, DELETED), and the object after and before."""

    rv: int
    type: str
    resource: str
    obj: Obj
    previous: Obj | None = None


class Store:
    """Objects by (plural, namespace, name), the write history, and the open watches."""

    def __init__(self, history_limit: int = HISTORY_LIMIT) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.rv = 0  # the last resourceVersion handed out
        self.floor = 0  # the history holds every write after this resourceVersion
        self.history: deque[Event] = deque()
        self.history_limit = history_limit
        self.watchers: set[asyncio.Queue[Event | None]] = set()

    # ------------------------------------------------------------ reads

    def get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        return self.objects.get((resource.plural, namespace, name))

    def list(self, resource: Resource, namespace: str | None, match: Callable[[Obj], bool]) -> list[Obj]:
        found = [
            obj
            for (plural, ns, _), obj in sorted(self.objects.items())
            if plural == resource.plural and namespace in (None, ns) and match(obj)
        ]
        return found

    # ------------------------------------------------------------ writes

    def create(self, resource: Resource, obj: Obj, generation: bool) -> Obj:
        meta = obj["metadata"]
        meta |= {"uid": str(uuid.uuid4()), "creationTimestamp": timestamp()}
        if generation:
            meta["generation"] = 1
        self.objects[(resource.plural, meta.get("namespace", ""), meta["name"])] = obj
        self._emit("ADDED", resource, obj, None)
        return obj

    def update(self, resource: Resource, obj: Obj, generation: bool) -> Obj:
        """Store ``obj`` over the current object of the same name; a write that changes nothing is
        no write (no new resourceVersion, no event), as in the apiserver."""
        meta = obj["metadata"]
        key = (resource.plural, meta.get("namespace", ""), meta["name"])  # "": cluster-scoped
        old = self.objects[key]
        for fixed in ("uid", "creationTimestamp", "resourceVersion", "generation"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
        if obj == old:
            return old
        if generation and _without_metadata(obj) != _without_metadata(old):
            # A custom resource without a status subresource: any change outside metadata is a new generation.
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        self.objects[key] = obj
        self._emit("MODIFIED", resource, obj, old)
        return obj

    def delete(self, resource: Resource, namespace: str, name: str) -> Obj:
        obj = self.objects.pop((resource.plural, namespace, name))
        self._emit("DELETED", resource, obj, obj)
        return obj

    def _emit(self, kind: str, resource: Resource, obj: Obj, previous: Obj | None) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        event = Event(self.rv, kind, resource.plural, copy.deepcopy(obj), copy.deepcopy(previous))
        self.history.append(event)
        while len(self.history) > self.history_limit:
            self.floor = self.history.popleft().rv
        for queue in self.watchers:
            queue.put_nowait(event)

    # ------------------------------------------------------------ watches

    def subscribe(self, since: int | None) -> tuple[list[Event], asyncio.Queue[Event | None]]:
        """The events after ``since`` (``None``: the current objects as ADDED, at the current
        resourceVersion) and a queue that gets every later one; ``None`` in it means "close"."""
        if since is not None and since < self.floor:
            raise status.expired(since, self.floor + 1)
        if since is None:
            backlog = [
                Event(self.rv, "ADDED", plural, copy.deepcopy(obj))
                for (plural, _, _), obj in sorted(self.objects.items())
            ]
        else:
            backlog = [e for e in self.history if e.rv > since]
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self.watchers.add(queue)
        return backlog, queue

    def unsubscribe(self, queue: asyncio.Queue[Event | None]) -> None:
        self.watchers.discard(queue)

    def drop_watches(self) -> int:
        """Close every open watch stream (the client sees a clean end and should resume)."""
        for queue in self.watchers:
            queue.put_nowait(None)
        return len(self.watchers)

    def compact(self) -> int:
        """Forget the history: a watch from any resourceVersion before now gets 410 Expired."""
        self.history.clear()
        self.floor = self.rv
        return self.rv


def _without_metadata(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k != "metadata"}


# ---------------------------------------------------------------- selectors

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split(text: str) -> list[str]:
    """Split a selector on the commas outside ``( )``."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current] if current.strip() else parts


def label_selector(text: str | None) -> Callable[[dict[str, str]], bool]:
    """A predicate over labels for ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x)``."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for part in _split(text or ""):
        m = _REQUIREMENT.match(part)
        if m is None or (m["neg"] and (m["op"] or m["set"])):
            raise status.bad_request(f"unable to parse requirement: {part.strip()!r}")
        key, op, value = m["key"], m["op"], m["value"]
        if m["set"]:
            values = {v.strip() for v in m["values"].split(",") if v.strip()}
            if m["set"] == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif op in ("=", "=="):
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif m["neg"]:
            checks.append(lambda labels, k=key: k not in labels)
        else:
            checks.append(lambda labels, k=key: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def field_selector(text: str | None) -> Callable[[Obj], bool]:
    """``metadata.name`` and ``metadata.namespace`` with ``=``, ``==`` and ``!=`` (what every resource supports)."""
    checks: list[Callable[[Obj], bool]] = []
    for part in _split(text or ""):
        m = re.match(r"^\s*metadata\.(name|namespace)\s*(==|=|!=)\s*([^\s,]*)\s*$", part)
        if m is None:
            raise status.bad_request(f'field label not supported: "{part.split("=")[0].strip("!")}"')
        field, negate, value = m[1], m[2] == "!=", m[3]
        checks.append(lambda obj, f=field, n=negate, v=value: (obj["metadata"].get(f) == v) != n)
    return lambda obj: all(check(obj) for check in checks)


def selector(labels: str | None, fields: str | None) -> Callable[[Obj], bool]:
    by_labels, by_fields = label_selector(labels), field_selector(fields)
    return lambda obj: by_fields(obj) and by_labels(obj["metadata"].get("labels") or {})
