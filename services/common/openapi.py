"""OpenAPI declarations the HTTP services share: the error body, what each refusal status means,
request bodies of routes that read their body themselves, and JSON Schemas of contract models.

A route that takes ``Request`` and reads the raw body has no body parameter, so FastAPI cannot
describe what it reads. These helpers give such a route an accurate ``requestBody`` (through
``openapi_extra``) and every status it can refuse with (through ``responses``), so the schema is
honest documentation and a fuzzer driven by it (``make fuzz``) sends what the route reads.

Guarantees: every schema here is self-contained (``$ref`` into ``$defs`` is inlined), so it can sit
anywhere in an OpenAPI document; nothing here changes what a route does at run time.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

#: Every refusal of the dispatcher, the web UI's API and the gateway: ``{"error": "<what to do>"}``.
ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {"error": {"type": "string", "description": "what went wrong and what to do about it"}},
    "required": ["error"],
}

#: What each refusal status means, for every route that can answer it.
WHY: dict[int, str] = {
    400: "malformed request (a Host this service does not answer to, a body that is not JSON or not the shape "
    "described)",
    401: "no API token, or a wrong one",
    403: "a cross-site request (its Origin is not this service's), or the read-only token on a state change",
    404: "no such experiment or trial",
    409: "the request conflicts with the current state (the experiment or trial has ended, a limit is reached)",
    413: "the body is over the size limit",
    415: "the body's Content-Type is not one this route accepts",
    422: "the body or a parameter is well-formed but invalid (the message names the field)",
    502: "a service this one relays to answered something it cannot read",
    503: "a service this answer needs is not running or not reachable (NATS, the trial's adapter); retry later",
    504: "a service this answer needs did not answer in time; retry later",
}


def refusals(
    *statuses: int, why: dict[int, str] | None = None, media_type: str = "application/json"
) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for the statuses a route refuses with, each with the error body;
    ``why={409: "…"}`` replaces the general description of a status for this route."""
    why = why or {}
    return {
        status: {"description": why.get(status, WHY[status]), "content": {media_type: {"schema": ERROR}}}
        for status in statuses
    }


def answer(
    status: int, description: str, schema: dict[str, Any], media_type: str = "application/json"
) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entry for a success answer with its body's schema."""
    return {status: {"description": description, "content": {media_type: {"schema": schema}}}}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """``openapi_extra=`` for a route that reads a JSON body itself (``Content-Type: application/json``)."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    }


def binary_body(media_types: tuple[str, ...], description: str) -> dict[str, Any]:
    """``openapi_extra=`` for a route that reads raw bytes of one of ``media_types``."""
    content = {media_type: {"schema": {"type": "string", "format": "binary"}} for media_type in media_types}
    return {"requestBody": {"required": True, "description": description, "content": content}}


def parameter(
    name: str, where: str, schema: dict[str, Any], description: str, required: bool = False
) -> dict[str, Any]:
    """One parameter a route reads itself (``request.query_params``, ``request.headers``)."""
    return {"name": name, "in": where, "required": required, "description": description, "schema": schema}


def parameters(*declared: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra=`` adding parameters a route reads itself (FastAPI appends them to its own)."""
    return {"parameters": list(declared)}


def merge(*extras: dict[str, Any]) -> dict[str, Any]:
    """Several ``openapi_extra`` pieces as one (parameter lists concatenated)."""
    merged: dict[str, Any] = {}
    for extra in extras:
        for key, value in extra.items():
            merged[key] = merged.get(key, []) + value if key == "parameters" else value
    return merged


def inline(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``{"$ref": "#/$defs/X"}`` replaced by ``X`` itself and ``$defs`` dropped
    (the contracts' models are not recursive; a recursive one is an error, not a hang)."""
    definitions = schema.get("$defs", {})

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:
                raise ValueError(f"schema {name} is recursive: it cannot be inlined")
            rest = {key: value for key, value in node.items() if key != "$ref"}
            return resolve({**definitions[name], **rest}, (*seen, name))
        return {key: resolve(value, seen) for key, value in node.items() if key != "$defs"}

    inlined: dict[str, Any] = resolve(schema, ())  # a dict, as ``schema`` is
    return inlined


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """What ``model`` accepts (camelCase, validation mode), self-contained."""
    return inline(model.model_json_schema(by_alias=True, mode="validation"))
