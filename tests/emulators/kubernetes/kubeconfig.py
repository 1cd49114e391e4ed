"""The kubeconfig that points a client at the emulator (cluster, user with the token, context)."""

from __future__ import annotations

from typing import Any

import yaml

NAME = "trialbus-emulator"


def kubeconfig(url: str, token: str | None, namespace: str = "default") -> dict[str, Any]:
    """A kubeconfig whose current context is the emulator, with ``namespace`` as its default namespace."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": {"server": url}}],
        "users": [{"name": NAME, "user": {"token": token} if token else {}}],
        "contexts": [{"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": namespace}}],
        "current-context": NAME,
        "preferences": {},
    }


def kubeconfig_yaml(url: str, token: str | None, namespace: str = "default") -> str:
    return yaml.safe_dump(kubeconfig(url, token, namespace), sort_keys=False)
