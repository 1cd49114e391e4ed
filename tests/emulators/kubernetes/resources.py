"""The resources the emulator serves (Kueue's are in ``kueue.py``), and the discovery documents
that announce them.

A client checks that FrameworkController is installed the way ``kubectl api-resources`` does:
``/apis`` lists the group, ``/apis/frameworkcontroller.microsoft.com/v1`` lists ``frameworks``.
Without the CRD (``serve_crd=False``) the group is absent and its paths answer 404, as on a
cluster where the controller never ran (FC issue #68).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FC_GROUP = "frameworkcontroller.microsoft.com"
FC_VERSION = "v1"


@dataclass(frozen=True)
class Resource:
    """One served resource type."""

    group: str  # "" for the core group
    version: str
    plural: str
    singular: str
    kind: str
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How the apiserver names the resource in messages: ``frameworks.<group>`` or ``secrets``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_suffix(self) -> str:
        return f".{self.group}" if self.group else ""

    @property
    def prefix(self) -> str:
        """The API root of this resource's group version."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def discovery(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        return entry


VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
FRAMEWORKS = Resource(FC_GROUP, FC_VERSION, "frameworks", "framework", "Framework", VERBS)
SECRETS = Resource("", "v1", "secrets", "secret", "Secret", VERBS)


def resource_list(group_version: str, resources: list[Resource]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [r.discovery() for r in resources],
    }


def core_versions(server_address: str) -> dict[str, Any]:
    """``GET /api``: the client's ``V1APIVersions`` needs ``serverAddressByClientCIDRs``."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def fc_group() -> dict[str, Any]:
    version = {"groupVersion": f"{FC_GROUP}/{FC_VERSION}", "version": FC_VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": FC_GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


def group_list(serve_crd: bool, extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``GET /apis``: the groups beyond core: FrameworkController's when its CRD is served, and ``extra``
    (Kueue's)."""
    groups = [*([fc_group()] if serve_crd else []), *(extra or [])]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def version_info() -> dict[str, str]:
    """``GET /version``, as a 1.28 apiserver answers it."""
    return {
        "major": "1",
        "minor": "28",
        "gitVersion": "v1.28.0-trialbus-emulator",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2024-01-01T00:00:00Z",
        "goVersion": "go1.21",
        "compiler": "gc",
        "platform": "linux/amd64",
    }
