"""Kubernetes ``Status`` errors, worded as the apiserver words them.

Every failure the emulator answers is a ``metav1.Status`` (``kind: Status``, ``status: Failure``,
``reason``, ``message``, ``details``, ``code``); the official client raises it as an
``ApiException`` whose ``status`` is the code and whose ``body`` is this JSON.
"""

from __future__ import annotations

from typing import Any

from .resources import Resource


class ApiError(Exception):
    """An error response: raised anywhere in a handler, answered by the app's error handler."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(resource: Resource, name: str, **more: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    return details | {"kind": resource.plural} | more


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.qualified} "{name}" not found', _details(resource, name))


def no_route() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def namespace_not_found(namespace: str) -> ApiError:
    return ApiError(404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"})


def already_exists(resource: Resource, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource.qualified} "{name}" already exists', _details(resource, name))


def conflict(resource: Resource, name: str) -> ApiError:
    message = (
        f'Operation cannot be fulfilled on {resource.qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    return ApiError(409, "Conflict", message, _details(resource, name))


def invalid(resource: Resource, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid: ``causes`` are ``{reason, message, field}``, as the apiserver lists them."""
    texts = [f"{c['field']}: {c['message']}" for c in causes]
    joined = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
    message = f'{resource.kind}{resource.group_suffix} "{name}" is invalid: {joined}'
    details = _details(resource, name, kind=resource.kind, causes=causes)
    return ApiError(422, "Invalid", message, details)


def cause(field: str, message: str, reason: str = "FieldValueInvalid") -> dict[str, str]:
    return {"reason": reason, "message": message, "field": field}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unsupported_patch() -> ApiError:
    """415: a custom resource takes JSON Patch and merge patch (and server-side apply), never strategic merge."""
    accepted = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    message = f"the body of the request was in an unknown format - accepted media types include: {accepted}"
    return ApiError(415, "UnsupportedMediaType", message)


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def method_not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
