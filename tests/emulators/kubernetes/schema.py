"""What the apiserver checks on a write: the Framework CRD's openAPIV3Schema, and a Secret's rules.

``FRAMEWORK_SCHEMA`` re-expresses the schema that FrameworkController's ``crd.go`` builds (a
name pattern, the executionType enum, integer bounds, no ``required`` anywhere, the pod template
and the status left open). ``check_framework`` walks it the way the apiserver does: violations
become 422 causes worded like kube-openapi's, fields the schema does not declare are pruned
silently (``fieldValidation=Warn``, the default, adds a ``Warning`` header) or rejected with 400
(``Strict``), and a ``null`` in a field that is not ``nullable`` is dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

from . import status
from .resources import FRAMEWORKS, SECRETS

NAME_PATTERN = "^[a-z0-9]{1,63}$"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
SECRET_KEY = r"[-._a-zA-Z0-9]+"
SECRET_LIMIT = 1024 * 1024
EXECUTION_TYPES = ("Create", "Start", "Stop")
#: executionType changes FrameworkController supports (besides none).
TRANSITIONS = {("Create", "Start"), ("Create", "Stop"), ("Start", "Stop")}

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_RETRY_POLICY = {
    "type": "object",
    "properties": {
        "maxRetryCount": {"type": "integer", "minimum": -2},
        "fancyRetryPolicy": {"type": "boolean"},
    },
}
METADATA_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": _OPEN},
        **{
            k: {"x-kubernetes-preserve-unknown-fields": True}
            for k in (
                "uid",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            )
        },
    },
}
FRAMEWORK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": METADATA_SCHEMA,
        "spec": {
            "type": "object",
            "properties": {
                "description": {"type": "string", "nullable": True},
                "executionType": {"type": "string", "enum": list(EXECUTION_TYPES)},
                "retryPolicy": _RETRY_POLICY,
                "taskRoles": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "pattern": NAME_PATTERN},
                            "taskNumber": {"type": "integer", "minimum": 0, "maximum": 10000},
                            "frameworkAttemptCompletionPolicy": {
                                "type": "object",
                                "properties": {
                                    "minFailedTaskCount": {"type": "integer", "minimum": -1},
                                    "minSucceededTaskCount": {"type": "integer", "minimum": -1},
                                },
                            },
                            "task": {
                                "type": "object",
                                "properties": {
                                    "retryPolicy": _RETRY_POLICY,
                                    "podGracefulDeletionTimeoutSec": {"type": "integer", "nullable": True},
                                    "pod": _OPEN,
                                },
                            },
                        },
                    },
                },
            },
        },
        "status": {**_OPEN, "nullable": True},
    },
}
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


@dataclass
class Findings:
    """What one walk found: 422 causes, and the paths of undeclared fields (already pruned)."""

    causes: list[dict[str, str]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _type_name(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), "object")


def _walk(value: Any, schema: dict[str, Any], path: str, found: Findings) -> None:
    expected = schema.get("type")
    if expected is not None and not _is(value, expected):
        given = _type_name(value)
        found.causes.append(
            status.cause(
                path,
                f'Invalid value: "{given}": {path} in body must be of type {expected}: "{given}"',
                "FieldValueTypeInvalid",
            )
        )
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(json.dumps(v) for v in schema["enum"])
        found.causes.append(
            status.cause(
                path, f"Unsupported value: {json.dumps(value)}: supported values: {supported}", "FieldValueNotSupported"
            )
        )
    if "pattern" in schema and not re.search(schema["pattern"], value):
        found.causes.append(
            status.cause(path, f"Invalid value: {json.dumps(value)}: {path} in body should match '{schema['pattern']}'")
        )
    if "minimum" in schema and value < schema["minimum"]:
        found.causes.append(
            status.cause(
                path, f"Invalid value: {value}: {path} in body should be greater than or equal to {schema['minimum']}"
            )
        )
    if "maximum" in schema and value > schema["maximum"]:
        found.causes.append(
            status.cause(
                path, f"Invalid value: {value}: {path} in body should be less than or equal to {schema['maximum']}"
            )
        )
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _walk(item, schema["items"], f"{path}[{i}]", found)
    if isinstance(value, dict):
        _walk_object(value, schema, path, found)


def _walk_object(value: dict[str, Any], schema: dict[str, Any], path: str, found: Findings) -> None:
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    for key in list(value):
        child = f"{path}.{key}" if path else key
        sub = (properties or {}).get(key, extra)
        if sub is None:
            if properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.unknown.append(child)
                del value[key]
            continue
        if value[key] is None and not sub.get("nullable"):
            del value[key]  # structural schemas prune nulls of non-nullable fields
            continue
        _walk(value[key], sub, child, found)


def _is(value: Any, expected: str) -> bool:
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected == "boolean":
        return isinstance(value, bool)
    return isinstance(value, {"object": dict, "array": list, "string": str}[expected])


def check_framework(obj: dict[str, Any], strict: bool, previous: dict[str, Any] | None = None) -> list[str]:
    """Validate and prune ``obj`` in place; return the warnings (pruned fields). ``previous`` is the
    stored object on an update, whose executionType bounds the new one."""
    found = Findings()
    _walk(obj, FRAMEWORK_SCHEMA, "", found)
    name = (obj.get("metadata") or {}).get("name") or ""
    if found.unknown and strict:
        fields = ", ".join(f'unknown field "{p}"' for p in found.unknown)
        raise status.bad_request(
            f'Framework in version "v1" cannot be handled as a Framework: strict decoding error: {fields}'
        )
    if previous is not None:
        old = (previous.get("spec") or {}).get("executionType") or "Start"
        new = (obj.get("spec") or {}).get("executionType") or "Start"
        if old != new and (old, new) not in TRANSITIONS:
            found.causes.append(
                status.cause(
                    "spec.executionType",
                    "Forbidden: executionType may change only Create -> Start|Stop and Start -> Stop, "
                    f"not {old} -> {new}",
                    "FieldValueForbidden",
                )
            )
    if found.causes:
        raise status.invalid(FRAMEWORKS, name, found.causes)
    return [f'unknown field "{p}"' for p in found.unknown]


def check_secret(obj: dict[str, Any]) -> None:
    """Normalise a Secret in place (``stringData`` folded into base64 ``data``, type ``Opaque`` by
    default) and check what the apiserver checks: the name, the keys, base64, the 1 MiB limit."""
    name = obj["metadata"].get("name") or ""
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        raise status.bad_request('Secret in version "v1" cannot be handled as a Secret: data must be an object')
    decoded: dict[str, bytes] = {}
    for key, value in data.items():
        try:
            decoded[key] = base64.b64decode(value if isinstance(value, str) else "", validate=True)
        except binascii.Error:
            raise status.bad_request(
                f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data in data.{key}'
            ) from None
    for key, value in (obj.pop("stringData", None) or {}).items():
        decoded[key] = str(value).encode()
    causes = []
    if not re.fullmatch(DNS_SUBDOMAIN, name) or len(name) > 253:
        causes.append(
            status.cause(
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must '
                "consist of lower case alphanumeric characters, '-' or '.', and must start and end "
                f"with an alphanumeric character (regex used for validation is '{DNS_SUBDOMAIN}')",
            )
        )
    causes += [
        status.cause(
            f"data[{key}]",
            f"Invalid value: \"{key}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
        )
        for key in decoded
        if not re.fullmatch(SECRET_KEY, key)
    ]
    if sum(len(v) for v in decoded.values()) > SECRET_LIMIT:
        causes.append(status.cause("data", f"Too long: must have at most {SECRET_LIMIT} bytes", "FieldValueTooLong"))
    if causes:
        raise status.invalid(SECRETS, name, causes)
    obj["data"] = {k: base64.b64encode(v).decode() for k, v in decoded.items()}
    obj.setdefault("type", "Opaque")
