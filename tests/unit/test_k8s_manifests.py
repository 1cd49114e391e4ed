"""The manifests in ``k8s/`` validate offline as Kubernetes 1.30 objects, and the adapter's
Role grants what the frameworkcontroller adapter calls, and nothing more."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_every_manifest_validates(path: Path):
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert documents, f"{path.name} is empty"
    for doc in documents:
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_the_frameworkcontroller_role_grants_exactly_what_the_adapter_uses():
    docs = {d["kind"]: d for d in yaml.safe_load_all((K8S / "frameworkcontroller-rbac.yaml").read_text())}
    rules = {(rule["apiGroups"][0], resource): set(rule["verbs"])
             for rule in docs["Role"]["rules"] for resource in rule["resources"]}  # fmt: skip
    assert rules == {
        ("frameworkcontroller.microsoft.com", "frameworks"): {"create", "get", "list", "watch", "patch", "delete"},
        ("", "secrets"): {"create", "delete"},
    }
    binding = docs["RoleBinding"]
    assert binding["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": docs["ServiceAccount"]["metadata"]["name"],
                                    "namespace": docs["ServiceAccount"]["metadata"]["namespace"]}]  # fmt: skip
