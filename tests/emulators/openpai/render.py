"""What the rest-server does to a job after its schema check, and what the runtime renders.

* ``load_yaml``: js-yaml ``safeLoad`` semantics where they differ from PyYAML's defaults
  (duplicate keys are an error; only true/false are booleans; ``1e3`` is a number; keys are strings).
* ``semantic_error``: the checks of ``protocolValidate`` after the schema (A.4 step 6).
* ``entrypoints``: ``protocolRender``: per task role, the default deployment's preCommands,
  the trimmed commands and postCommands joined by newlines, ``<% %>`` rendered from
  ``$parameters`` and the role's ``$script``/``$output``/``$data``; unresolved references (so
  every ``$secrets`` one) are left in place as ``<% name %>``.
* ``render_secrets``: openpai-runtime's ``render_string_with_secrets`` (pystache, HTML-escaping,
  unresolved names become empty), applied to the command at run time.
* ``masked``: the stored config, ``secrets`` replaced by ``"******"``.
"""

from __future__ import annotations

import html
import re
from typing import Any

import yaml

PREREQUISITE_TYPES = ("script", "output", "data", "dockerimage")
PREREQUISITE_FIELDS = ("script", "output", "data", "dockerImage")
_TAG = re.compile(r"<%(.*?)%>", re.S)


class TemplateError(Exception):
    """mustache.js refused the template (the server answers 500 UnknownError)."""


class _JsYamlLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[str, Any]:
        explicit = sum(k.tag != "tag:yaml.org,2002:merge" for k, _ in node.value)
        self.flatten_mapping(node)
        merged = len(node.value) - explicit  # "<<" entries come first; explicit keys may override them
        mapping: dict[str, Any] = {}
        seen: set[str] = set()
        for i, (key_node, value_node) in enumerate(node.value):
            key = self.construct_object(key_node, deep=True)
            key = key if isinstance(key, str) else js_str(key)
            if i >= merged:
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, "duplicated mapping key", key_node.start_mark)
                seen.add(key)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


_BOOL, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
_JsYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_JsYamlLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_JsYamlLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse like js-yaml ``safeLoad``; raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=_JsYamlLoader)


def js_str(value: Any) -> str:
    """``String(value)`` in JavaScript."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, list):
        return ",".join("" if v is None else js_str(v) for v in value)
    if isinstance(value, dict):
        return "[object Object]"
    return str(value)


def semantic_error(job: dict[str, Any]) -> str | None:
    """The first failing reference check, as the server's message, or None."""
    by_type: dict[str, set[str]] = {t: set() for t in PREREQUISITE_TYPES}
    for item in job.get("prerequisites", []):
        if item["name"] in by_type[item["type"]]:
            return f"Duplicate {item['type']} prerequisites {item['name']}."
        by_type[item["type"]].add(item["name"])
    all_names = set().union(*by_type.values())
    deployments: set[str] = set()
    for item in job.get("deployments", []):
        if item["name"] in deployments:
            return f"Duplicate deployments {item['name']}."
        deployments.add(item["name"])
    roles = job["taskRoles"].values()
    for role in roles:
        for name in role.get("prerequisites", []):
            if name not in all_names:
                return f"Prerequisite {name} does not exist."
    for role in roles:
        for field in PREREQUISITE_FIELDS:
            if field in role and role[field] not in by_type[field.lower()]:
                return f"Prerequisite {role[field]} does not exist."
    default = job.get("defaults", {}).get("deployment")
    if "deployment" in job.get("defaults", {}) and default not in deployments:
        return f"Default deployment {default} does not exist."
    return None


def _lookup(view: dict[str, Any], name: str) -> Any:
    value: Any = view
    for part in name.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _tags(template: str) -> list[tuple[str, str]]:
    """mustache.js tokens with ``<% %>`` delimiters: ("text", s) or (kind, name); sections are skipped."""
    tokens: list[tuple[str, str]] = []
    pos, depth = 0, 0
    while True:
        start = template.find("<%", pos)
        if start < 0:
            if depth:
                raise TemplateError(f"Unclosed section at {len(template)}")
            tokens.append(("text", template[pos:]))
            return tokens
        end = template.find("%>", start + 2)
        if end < 0:
            raise TemplateError(f"Unclosed tag at {len(template)}")
        if not depth:
            tokens.append(("text", template[pos:start]))
        body = template[start + 2 : end].strip()
        kind = body[:1] if body[:1] in "#^/!>&{=" else "name"
        name = body[1:].strip().rstrip("}").strip() if kind != "name" else body
        if kind in "#^":
            depth += 1
        elif kind == "/":
            depth -= 1
        elif not depth:
            tokens.append((kind, name))
        pos = end + 2


def render_submit(template: str, view: dict[str, Any]) -> str:
    """The rest-server's ``render``: plain names only, unresolved ones kept as ``<% name %>``."""
    out = []
    for kind, value in _tags(template):
        if kind == "text":
            out.append(value)
        elif kind == "name":
            name = re.sub(r"\[(\d+)\]", r".\1", value)
            found = _lookup(view, name)
            out.append(f"<% {name} %>" if found is None else js_str(found))
    return "".join(out).strip()


def entrypoints(job: dict[str, Any]) -> dict[str, str]:
    """USER_CMD per task role, as the rest-server builds it at submission."""
    prereqs: dict[str, dict[str, Any]] = {t: {} for t in PREREQUISITE_TYPES}
    for item in job.get("prerequisites", []):
        prereqs[item["type"]][item["name"]] = item
    deployment: dict[str, Any] = {}
    if "deployment" in job.get("defaults", {}):
        deployment = next(d for d in job.get("deployments", []) if d["name"] == job["defaults"]["deployment"])
    result = {}
    for name, role in job["taskRoles"].items():
        hooks = deployment.get("taskRoles", {}).get(name, {})
        commands = [*hooks.get("preCommands", []), *role["commands"], *hooks.get("postCommands", [])]
        view = {
            "$parameters": job.get("parameters"),
            "$script": prereqs["script"].get(role.get("script")),
            "$output": prereqs["output"].get(role.get("output")),
            "$data": prereqs["data"].get(role.get("data")),
        }
        result[name] = render_submit("\n".join(c.strip() for c in commands), view)
    return result


def _index_lists(obj: Any) -> Any:
    if isinstance(obj, list):
        return {str(i): v for i, v in enumerate(obj)}
    if isinstance(obj, dict):
        return {k: _index_lists(v) for k, v in obj.items()}
    return obj


def render_secrets(command: str, secrets: Any) -> str:
    """openpai-runtime's run-time rendering; a job without secrets keeps its command verbatim."""
    if not secrets:
        return command
    view = {"$secrets": _index_lists(secrets)}

    def one(match: re.Match[str]) -> str:
        body = match.group(1).strip()
        kind = body[:1] if body[:1] in "#^/!>&{=" else "name"
        if kind not in ("name", "&", "{"):
            return ""
        name = re.sub(r"\[(\d+)\]", r".\1", body if kind == "name" else body[1:].strip().rstrip("}").strip())
        value = _lookup(view, name)
        text = "" if value is None else str(value)
        return html.escape(text, quote=True) if kind == "name" else text

    return _TAG.sub(one, command)


def masked(job: dict[str, Any]) -> dict[str, Any]:
    """The config as stored and served: secrets hidden."""
    return {**job, "secrets": "******"} if "secrets" in job else dict(job)
