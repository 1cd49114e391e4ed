"""The rest-server's job-protocol schema (``config/v2/protocol.js``), as pydantic models.

This is the schema the server *enforces*, which is stricter than the published
``openpai-protocol`` schema in places (unknown keys at the top level, in a task role,
``completion`` and ``resourcePerInstance`` are rejected; cpu/memoryMB/gpu are required;
``ports`` needs at least one entry with a C-identifier label) and looser in others
(``prerequisites`` is optional; ``version`` may be a number; ``extras`` is any object).

Types follow JavaScript/AJV semantics rather than Python's: ``1.0`` is an integer, ``true`` is
not, and a string is never coerced. ``ajv_errors`` turns a pydantic error into the AJV v6
error objects the server puts, serialised as a JSON array, in its 400 ``InvalidProtocolError``
message (keyword, dataPath, schemaPath, params, message).

Deliberate deviation: ``taskRoles`` and ``ports`` must be objects. AJV's schema has no
``type`` on them, so the real server lets a string through and then fails later.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PlainValidator, Tag, ValidationError
from pydantic_core import PydanticCustomError

NAME_PATTERN = "^[a-zA-Z0-9_-]+$"
KEY_PATTERN = "^[a-zA-Z_][a-zA-Z0-9_]*$"
_KEY_FIELDS = {"taskRoles": KEY_PATTERN, "ports": KEY_PATTERN}  # objects whose keys are patternProperties
_ONE_OF = {"oneOf:script": 0, "oneOf:data": 1, "oneOf:dockerimage": 2}


def _ajv(keyword: str, message: str, **params: Any) -> PydanticCustomError:
    return PydanticCustomError("ajv", message, {"keyword": keyword, "params": params})


def _type_error(name: str) -> PydanticCustomError:
    return _ajv("type", f"should be {name}", type=name)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_integer(v: Any) -> bool:
    return _is_number(v) and float(v).is_integer()


def _integer(minimum: int | None = None, nullable: bool = False) -> Any:
    def check(v: Any) -> Any:
        if v is None and nullable:
            return None
        if not _is_integer(v):
            raise _type_error("integer,null" if nullable else "integer")
        if minimum is not None and v < minimum:
            raise _ajv("minimum", f"should be >= {minimum}", comparison=">=", limit=minimum, exclusive=False)
        return v

    return Annotated[Any, PlainValidator(check)]


def _string(pattern: str | None = None, max_length: int | None = None, enum: tuple[str, ...] = ()) -> Any:
    def check(v: Any) -> Any:
        if not isinstance(v, str):
            raise _type_error("string")
        if max_length is not None and len(v) > max_length:
            raise _ajv("maxLength", f"should NOT be longer than {max_length} characters", limit=max_length)
        if pattern is not None and not re.search(pattern, v):
            raise _ajv("pattern", f'should match pattern "{pattern}"', pattern=pattern)
        if enum and v not in enum:
            raise _ajv("enum", "should be equal to one of the allowed values", allowedValues=list(enum))
        return v

    return Annotated[Any, PlainValidator(check)]


def _check_protocol_version(v: Any) -> Any:
    if v == "2" or (_is_number(v) and v == 2):
        return v
    raise _ajv("enum", "should be equal to one of the allowed values", allowedValues=["2", 2])


def _check_string_or_number(v: Any) -> Any:
    if isinstance(v, str) or _is_number(v):
        return v
    raise _type_error("string,number")


def _check_object(v: Any) -> Any:
    if not isinstance(v, dict):
        raise _type_error("object")
    return v


def _check_key(v: Any) -> Any:
    if not re.search(KEY_PATTERN, v):
        raise PydanticCustomError("ajv_key", "should NOT have additional properties")
    return v


Int = _integer()
Str = _string()
Name = _string(NAME_PATTERN, 255)
Key = Annotated[str, PlainValidator(_check_key)]
Version = Annotated[Any, PlainValidator(_check_string_or_number)]
ProtocolVersion = Annotated[Any, PlainValidator(_check_protocol_version)]
Obj = Annotated[Any, PlainValidator(_check_object)]
StrList = list[Str]
NonEmptyStrList = Annotated[list[Str], Field(min_length=1)]

_FORBID = ConfigDict(extra="forbid")
_ALLOW = ConfigDict(extra="allow")

# Fields default to None without being Optional: an absent key is fine, an explicit null is not (as in AJV).


class Completion(BaseModel):
    model_config = _FORBID
    minFailedInstances: _integer(nullable=True) = None
    minSucceededInstances: _integer(nullable=True) = None


class ExtraContainerOptions(BaseModel):
    # Upstream quirk: "additionalProperties: false" sits inside ``properties``, so any key passes.
    model_config = _ALLOW
    shmMB: Int = None


class Resources(BaseModel):
    model_config = _FORBID
    cpu: Int
    memoryMB: Int
    gpu: Int
    ports: Annotated[dict[Key, Int], Field(min_length=1)] = None


class TaskRole(BaseModel):
    model_config = _FORBID
    protocolVersion: ProtocolVersion = None
    instances: _integer(minimum=1) = None
    completion: Completion = None
    taskRetryCount: Int = None
    prerequisites: StrList = None
    dockerImage: Str
    data: Str = None
    output: Str = None
    script: Str = None
    extraContainerOptions: ExtraContainerOptions = None
    resourcePerInstance: Resources
    commands: NonEmptyStrList


class _PrerequisiteBase(BaseModel):
    protocolVersion: ProtocolVersion = None
    name: Name
    version: Version = None
    contributor: Str = None
    description: Str = None


class ScriptPrerequisite(_PrerequisiteBase):
    model_config = _ALLOW
    type: _string(enum=("script", "output"))
    plugin: Str = None
    require: StrList = None
    uri: Str = None


class DataPrerequisite(_PrerequisiteBase):
    model_config = _ALLOW
    type: _string(enum=("data",))
    plugin: Str = None
    require: StrList = None
    uri: StrList = None


class DockerAuth(BaseModel):
    model_config = _ALLOW
    username: Str = None
    password: Str = None
    registryuri: Str = None


class DockerPrerequisite(_PrerequisiteBase):
    model_config = _FORBID
    type: _string(enum=("dockerimage",))
    auth: DockerAuth = None
    uri: Str


def _prerequisite_kind(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else None
    if not isinstance(kind, str):
        return None
    return {"script": "oneOf:script", "output": "oneOf:script", "data": "oneOf:data"}.get(
        kind, "oneOf:dockerimage" if kind == "dockerimage" else None
    )


Prerequisite = Annotated[
    Annotated[ScriptPrerequisite, Tag("oneOf:script")]
    | Annotated[DataPrerequisite, Tag("oneOf:data")]
    | Annotated[DockerPrerequisite, Tag("oneOf:dockerimage")],
    Discriminator(
        _prerequisite_kind,
        custom_error_type="ajv_oneOf",
        custom_error_message="should match exactly one schema in oneOf",
    ),
]


class DeploymentRole(BaseModel):
    model_config = _FORBID
    preCommands: NonEmptyStrList = None
    postCommands: NonEmptyStrList = None


class Deployment(BaseModel):
    model_config = _ALLOW
    protocolVersion: ProtocolVersion = None
    name: Name
    taskRoles: Annotated[dict[Key, DeploymentRole], Field(min_length=1)]


class Defaults(BaseModel):
    model_config = _ALLOW  # virtualCluster is not even typed by the server's schema
    deployment: Str = None


class JobProtocol(BaseModel):
    model_config = _FORBID
    protocolVersion: ProtocolVersion
    name: Name
    type: _string(enum=("job",))
    version: Version = None
    contributor: Str = None
    description: Str = None
    prerequisites: Annotated[list[Prerequisite], Field(min_length=1)] = None
    parameters: Obj = None
    secrets: Obj = None
    jobRetryCount: _integer(minimum=0) = None
    taskRoles: Annotated[dict[Key, TaskRole], Field(min_length=1)]
    deployments: Annotated[list[Deployment], Field(min_length=1)] = None
    defaults: Defaults = None
    extras: Obj = None


# ---------------------------------------------------------------- AJV-style errors


def _data_path(loc: list[Any]) -> str:
    out = ""
    for seg in loc:
        if isinstance(seg, int):
            out += f"[{seg}]"
        elif re.fullmatch(r"[a-zA-Z$_][a-zA-Z$_0-9]*", seg):
            out += f".{seg}"
        else:
            out += "['" + seg.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return out


def _schema_path(loc: list[Any], keyword: str) -> str:
    parts, key_pattern = ["#"], None
    for seg in loc:
        if isinstance(seg, str) and seg in _ONE_OF:
            parts += ["oneOf", str(_ONE_OF[seg])]
        elif isinstance(seg, int):
            parts.append("items")
        elif key_pattern is not None:
            parts += ["patternProperties", quote(key_pattern, safe="-_.!~*'()")]
            key_pattern = None
            continue
        else:
            parts += ["properties", seg]
            key_pattern = _KEY_FIELDS.get(seg)
            continue
        key_pattern = None
    return "/".join([*parts, keyword])


def _one(loc: list[Any], keyword: str, params: dict[str, Any], message: str) -> dict[str, Any]:
    data_loc = [seg for seg in loc if not (isinstance(seg, str) and seg in _ONE_OF)]
    return {
        "keyword": keyword,
        "dataPath": _data_path(data_loc),
        "schemaPath": _schema_path(loc, keyword),
        "params": params,
        "message": message,
    }


def ajv_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """The AJV v6 (allErrors) error list for a failed ``JobProtocol`` validation."""
    errors = exc.errors(include_url=False)
    # AJV never looks inside a property that fails additionalProperties; pydantic does.
    bad_keys = [tuple(e["loc"][:-1]) for e in errors if e["type"] == "ajv_key"]
    out = []
    for err in errors:
        loc, kind, ctx = list(err["loc"]), err["type"], err.get("ctx") or {}
        if kind != "ajv_key" and any(tuple(loc[: len(k)]) == k for k in bad_keys):
            continue
        if kind == "missing":
            name = loc.pop()
            out.append(_one(loc, "required", {"missingProperty": name}, f"should have required property '{name}'"))
        elif kind == "extra_forbidden" or (kind == "ajv_key" and loc[-1:] == ["[key]"]):
            name = loc.pop() if kind == "extra_forbidden" else loc[-2]
            loc = loc[:-2] if kind == "ajv_key" else loc
            out.append(
                _one(loc, "additionalProperties", {"additionalProperty": name}, "should NOT have additional properties")
            )
        elif kind == "ajv":
            out.append(_one(loc, ctx["keyword"], ctx["params"], err["msg"]))
        elif kind == "ajv_oneOf":
            out.append(_one(loc, "oneOf", {"passingSchemas": None}, err["msg"]))
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            out.append(_one(loc, "type", {"type": "object"}, "should be object"))
        elif kind == "list_type":
            out.append(_one(loc, "type", {"type": "array"}, "should be array"))
        elif kind == "too_short":
            what = "properties" if isinstance(err["input"], dict) else "items"
            keyword = "minProperties" if what == "properties" else "minItems"
            out.append(_one(loc, keyword, {"limit": 1}, f"should NOT have fewer than 1 {what}"))
        else:  # not expected; keep the information rather than hide it
            out.append(_one(loc, kind, {}, err["msg"]))
    return out


def schema_errors(obj: Any) -> list[dict[str, Any]]:
    """Empty when ``obj`` passes the server's schema, else its AJV-style errors."""
    try:
        JobProtocol.model_validate(obj)
    except ValidationError as exc:
        return ajv_errors(exc)
    return []
