"""compose.yaml, read once: the services ``trialbus up`` runs as local processes, and how each restarts.

compose.yaml is the one definition of the stack: its services (command, environment, order)
and their ``restart:`` policies, nats included. ``trialbus up`` runs the same services with the
same settings; only what :data:`LOCAL` lists (addresses, ports, credentials, folders) differs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trialbus.stack.errors import StackError
from trialbus.stack.policy import RestartPolicy


class ComposeError(StackError):
    """compose.yaml cannot be read or says something ``trialbus up`` cannot run."""


@dataclass(frozen=True)
class ServiceDef:
    """One service of the stack. Strings may use ``{nats_port}``, ``{api_port}``,
    ``{gateway_port}``, ``{webui_port}``, ``{host}``, ``{data_dir}`` and ``{port}`` (a free
    port chosen each time the service starts, for its own ``/healthz``)."""

    name: str
    #: Arguments after the Python interpreter.
    argv: tuple[str, ...]
    #: Environment on top of the common one (NATS URL, data dir, PATH).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Secret settings as compose.yaml writes them (``${NATS_PASSWORD_DISPATCHER:?…}``): the stack
    #: fills the same variables with its own credentials (:mod:`trialbus.stack.credentials`).
    secrets: Mapping[str, str] = field(default_factory=dict)
    #: URL answering 200 once the service is ready; None: alive after a moment is enough.
    health: str | None = None
    #: What happens when it exits while the stack runs (compose's ``restart:``).
    restart: RestartPolicy = field(default_factory=RestartPolicy)


#: What differs between a container of compose.yaml and a local process: addresses, ports,
#: credentials and folders. Every other variable compose.yaml gives a service, its command and
#: the order of the services are the same locally.
LOCAL = {
    "TRIALBUS_NATS_URL",
    "TRIALBUS_NATS_CREDS",
    "TRIALBUS_ALLOWED_HOSTS",
    "TRIALBUS_API_HOST",
    "TRIALBUS_API_PORT",
    "TRIALBUS_GATEWAY_HOST",
    "TRIALBUS_GATEWAY_PORT",
    "TRIALBUS_GATEWAY_URL",
    "TRIALBUS_TRIAL_GATEWAY_URL",
    "TRIALBUS_DATA_DIR",
    "TRIALBUS_ADAPTER_HTTP_HOST",
    "TRIALBUS_ADAPTER_HTTP_PORT",
    "TRIALBUS_REPLICA",
    "TRIALBUS_TUNER_HTTP_HOST",
    "TRIALBUS_TUNER_HTTP_PORT",
    "TRIALBUS_WEBUI_HOST",
    "TRIALBUS_WEBUI_PORT",
    "TRIALBUS_WEBUI_URL",
}
#: Secret settings: compose.yaml says which service gets which; the local stack fills the
#: variables they name with its own credentials, never from the user's environment by accident.
SECRETS = {
    "TRIALBUS_NATS_PASSWORD",
    "TRIALBUS_API_TOKEN",
    "TRIALBUS_API_READ_TOKEN",
    "TRIALBUS_TRIAL_SECRET",
    "TRIALBUS_SECRETS_KEY",
    "TRIALBUS_NATS_CALLOUT_SEED",
}
#: The local values of those, per kind of service (the common ones come from the stack).
LOCAL_ENV = {
    "services.dispatcher": {
        "TRIALBUS_API_HOST": "{host}",
        "TRIALBUS_API_PORT": "{api_port}",
        "TRIALBUS_WEBUI_URL": "http://{host}:{webui_port}",
    },  # linked from its page at /
    "services.metrics_gateway": {"TRIALBUS_GATEWAY_HOST": "{host}", "TRIALBUS_GATEWAY_PORT": "{gateway_port}"},
    "adapter": {
        "TRIALBUS_REPLICA": "{name}-0",
        "TRIALBUS_GATEWAY_URL": "http://{host}:{gateway_port}",
        "TRIALBUS_ADAPTER_HTTP_HOST": "{host}",
        "TRIALBUS_ADAPTER_HTTP_PORT": "{port}",
    },
    "services.adapters.local_gpu": {"TRIALBUS_WORK_DIR": "{data_dir}/trials"},
    "services.tuner": {
        "TRIALBUS_REPLICA": "{name}-0",
        "TRIALBUS_TUNER_HTTP_HOST": "{host}",
        "TRIALBUS_TUNER_HTTP_PORT": "{port}",
    },
    "services.webui": {"TRIALBUS_WEBUI_HOST": "{host}", "TRIALBUS_WEBUI_PORT": "{webui_port}"},
}
HEALTH = {
    "services.dispatcher": "http://{host}:{api_port}/healthz",
    "services.metrics_gateway": "http://{host}:{gateway_port}/healthz",
    "services.webui": "http://{host}:{webui_port}/healthz",
    "adapter": "http://{host}:{port}/healthz",
    "services.tuner": "http://{host}:{port}/healthz",
}


def compose_file() -> Path:
    """compose.yaml: ``TRIALBUS_COMPOSE_FILE``, else the copy an installed wheel carries, else the repository's."""
    if os.environ.get("TRIALBUS_COMPOSE_FILE"):
        return Path(os.environ["TRIALBUS_COMPOSE_FILE"])
    packaged = Path(__file__).with_name("compose.yaml")
    return packaged if packaged.exists() else Path(__file__).resolve().parents[2] / "compose.yaml"


def _read(path: Path | None) -> tuple[Path, dict[str, Any]]:
    import yaml

    path = path or compose_file()
    try:
        services = yaml.safe_load(path.read_text())["services"]
        if not isinstance(services, dict):
            raise TypeError("services is not a mapping")
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ComposeError(f"cannot read the services of {path}: {exc}") from None
    return path, services


def _policy(path: Path, name: str, spec: dict[str, Any]) -> RestartPolicy:
    try:
        return RestartPolicy.parse(spec.get("restart"))
    except ValueError as exc:
        raise ComposeError(f"{path}, service {name}: {exc}") from None


def compose_services(path: Path | None = None) -> tuple[ServiceDef, ...]:
    """The Trialbus services of compose.yaml, in its order, as local processes: each one's
    ``python -m <module>`` command, its restart policy and its environment, less what
    :data:`LOCAL` lists (set here to local addresses) and less ``${VAR}`` references to unset
    variables (compose fills them from ``.env``). :data:`SECRETS` are kept as written, for the
    stack to fill with its own credentials.
    ``nats`` and the services of a profile (the emulators) are not part of the stack."""
    path, services = _read(path)
    found = []
    for name, spec in services.items():
        command = list(spec.get("command") or [])
        if name == "nats" or spec.get("profiles") or command[:2] != ["python", "-m"]:
            continue
        module = command[2]
        env, secrets = {}, {}
        for key, value in (spec.get("environment") or {}).items():
            if key in SECRETS:
                secrets[key] = str(value)
            elif key not in LOCAL and (resolved := interpolate(str(value), os.environ)) is not None:
                env[key] = resolved
        kind = "adapter" if module.startswith("services.adapters.") else module
        for local in (LOCAL_ENV.get(kind, {}), LOCAL_ENV.get(module, {}) if kind != module else {}):
            env.update({key: value.replace("{name}", name) for key, value in local.items()})
        found.append(ServiceDef(name, tuple(command[1:]), env, secrets, HEALTH.get(kind), _policy(path, name, spec)))
    return tuple(found)


def nats_restart_policy(path: Path | None = None) -> RestartPolicy:
    """The ``restart:`` of compose.yaml's ``nats`` service: the embedded nats-server's."""
    path, services = _read(path)
    return _policy(path, "nats", services.get("nats") or {})


def interpolate(value: str, variables: Mapping[str, str]) -> str | None:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` from ``variables``;
    None when a variable without a default is unset (the key is then left out)."""
    missing = False

    def one(match: re.Match[str]) -> str:
        nonlocal missing
        name, op, default = match.group(1), match.group(2), match.group(3) or ""
        if variables.get(name):
            return variables[name]
        if op == ":-":
            return default
        missing = True
        return ""

    resolved = re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)
    return None if missing else resolved


#: The services, in start order (stopped in reverse), as compose.yaml defines them.
SERVICES: tuple[ServiceDef, ...] = compose_services()
#: How the embedded nats-server restarts: as compose.yaml's ``nats`` service.
NATS_RESTART: RestartPolicy = nats_restart_policy()
