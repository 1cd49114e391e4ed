"""The Kubernetes manifests in ``k8s/`` (a kustomize base and its overlays) build with
``kubectl kustomize``, validate offline as Kubernetes 1.30 objects, and keep what a deployment
relies on: hardened pods with probes and resources, adapters with stable names, autoscalers
and disruption budgets, a NATS cluster of 3 on volumes whose configuration nats-server
accepts, one NATS user per service that auth.conf defines, default-deny network policies,
production secrets that never come from the examples, and an adapter Role that grants what
the frameworkcontroller adapter calls, and nothing more."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from services.dispatcher.callout import new_issuer
from tests.fixtures.kubernetes import K8S, kustomize, operator_tree
from tests.fixtures.nats import nats_server_binary, require_binary

BASE = K8S / "base"
#: The base and every overlay, by name (``production`` is k8s/overlays/production).
BUILDS = ("base", *sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml")))
IMAGE = "ghcr.io/trialbus/trialbus"
WORKLOADS = ("Deployment", "StatefulSet")
#: Each Trialbus workload: its command's module and its NATS user (auth.conf).
SERVICES = {
    "dispatcher": ("services.dispatcher", "dispatcher"),
    "metrics-gateway": ("services.metrics_gateway", "gateway"),
    "local-gpu": ("services.adapters.local_gpu", "local-gpu"),
    "remote": ("services.adapters.remote", "remote"),
    "openpai": ("services.adapters.openpai", "openpai"),
    "frameworkcontroller": ("services.adapters.frameworkcontroller", "frameworkcontroller"),
    "tuner": ("services.tuner", "tuner"),
    "webui": ("services.webui", "webui"),
}
ADAPTERS = ("local-gpu", "remote", "openpai", "frameworkcontroller")
#: Tuners and the CLI log in as this user; no workload of ours does.
CLIENT_USER = "client"


def password_key(user: str) -> str:
    return "NATS_PASSWORD_" + user.upper().replace("-", "_")


def build_dir(root: Path, build: str) -> Path:
    return root / build if build == "base" else root / "overlays" / build


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return operator_tree(tmp_path_factory.mktemp("k8s"))


@pytest.fixture(scope="module")
def rendered(tree) -> dict[str, list[dict]]:
    """Every build's documents, by build."""
    builds = {}
    for build in BUILDS:
        result = kustomize(build_dir(tree, build))
        assert result.returncode == 0, f"kubectl kustomize {build} failed:\n{result.stderr}"
        builds[build] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return builds


def of_kind(docs: list[dict], *kinds: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] in kinds}


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


def budgets_of(docs: list[dict], pod_labels: dict[str, str]) -> list[dict]:
    """The PodDisruptionBudgets whose selector picks pods with these labels."""
    return [
        budget
        for budget in of_kind(docs, "PodDisruptionBudget").values()
        if budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ]


def auth_users() -> set[str]:
    return set(re.findall(r"^\s*user\s*[:=]\s*\"?([\w-]+)\"?", (BASE / "nats" / "auth.conf").read_text(), re.M))


# ---------------------------------------------------------------- building and validating


@pytest.mark.parametrize("build", BUILDS)
def test_every_rendered_document_validates_as_kubernetes_1_30(rendered, build):
    documents = rendered[build]
    assert documents, f"{build} renders nothing"
    for doc in documents:
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_production_does_not_build_with_no_secrets_of_its_own(tree, tmp_path):
    # Given a checkout where the operator has not written overlays/production/secrets.env
    copy = tmp_path / "k8s"
    shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("secrets.env"))
    shutil.copy(tree / "base" / "secrets.env", copy / "base" / "secrets.env")
    # When production is built, then it fails and says what is missing
    result = kustomize(copy / "overlays" / "production")
    assert result.returncode != 0 and "secrets.env" in result.stderr
    # And with the file, none of the base's example values is left
    example = (BASE / "secrets.env").read_text()
    [secret] = of_kind(yaml.safe_load_all(kustomize(tree / "overlays" / "production").stdout), "Secret").values()
    assert set(secret["data"]) == set(re.findall(r"^([A-Z_]+)=", example, re.M))
    values = {base64.b64decode(value).decode() for value in secret["data"].values()}
    assert not values & set(re.findall(r"^[A-Z_]+=(.*)$", example, re.M))


# ---------------------------------------------------------------- every workload


@pytest.mark.parametrize("build", BUILDS)
def test_every_workload_runs_hardened_with_probes_and_resources(rendered, build):
    workloads = of_kind(rendered[build], *WORKLOADS)
    assert set(SERVICES) | {"nats"} <= set(workloads)
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        pod_security = pod.get("securityContext", {})
        assert pod.get("automountServiceAccountToken") is (name == "frameworkcontroller"), name
        for container in pod["containers"]:
            where = f"{build}: {name}/{container['name']}"
            security = {**pod_security, **container.get("securityContext", {})}
            assert security.get("runAsNonRoot") is True and security.get("runAsUser", 0) != 0, where
            assert security.get("readOnlyRootFilesystem") is True, where
            assert security.get("allowPrivilegeEscalation") is False, where
            assert security.get("capabilities", {}).get("drop") == ["ALL"], where
            assert security.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert "readinessProbe" in container and "livenessProbe" in container, where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"].get(bound, {})), f"{where}: {bound}"
            image = container["image"]
            assert ":" in image and not image.endswith((":latest", ":")), f"{where}: unpinned image {image}"


@pytest.mark.parametrize("build", BUILDS)
def test_each_service_runs_its_command_as_its_own_nats_user(rendered, build):
    workloads = of_kind(rendered[build], *WORKLOADS)
    users = auth_users()
    assert users == {user for _, user in SERVICES.values()} | {CLIENT_USER}, "auth.conf's users"
    for name, (module, user) in SERVICES.items():
        pod = workloads[name]["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["image"].startswith(f"{IMAGE}:"), name
        assert container["command"] == ["python", "-m", module], name
        assert pod["securityContext"]["runAsUser"] == 10001, name
        env = env_of(container)
        assert env["TRIALBUS_NATS_USER"]["value"] == user and user in users, name
        password = env["TRIALBUS_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert password["key"] == password_key(user) and password["name"].startswith("trialbus-secrets"), name
        assert [source["configMapRef"]["name"].rsplit("-", 1)[0] for source in container["envFrom"]] == [
            "trialbus-settings"
        ], name
        mounts = {mount["mountPath"] for mount in container["volumeMounts"] if not mount.get("readOnly")}
        assert {"/data", "/tmp"} <= mounts, f"{name}: writable /data (TRIALBUS_DATA_DIR) and /tmp"
        assert "trialbus.io/bus-client" in workloads[name]["spec"]["template"]["metadata"]["labels"], name
    [settings] = [doc for doc in rendered[build] if doc["metadata"]["name"].startswith("trialbus-settings")]
    assert settings["data"]["TRIALBUS_NATS_URL"] == "nats://nats:4222"
    assert settings["data"]["TRIALBUS_DATA_DIR"] == "/data"
    assert settings["data"]["TRIALBUS_GATEWAY_URL"] == "http://metrics-gateway.trialbus.svc:8081"


@pytest.mark.parametrize("build", BUILDS)
def test_the_http_services_listen_on_every_address_behind_their_services(rendered, build):
    docs = rendered[build]
    workloads, services = of_kind(docs, *WORKLOADS), of_kind(docs, "Service")
    for name, variable, port in (
        ("dispatcher", "TRIALBUS_API_HOST", 8080),
        ("metrics-gateway", "TRIALBUS_GATEWAY_HOST", 8081),
    ):
        template = workloads[name]["spec"]["template"]
        [container] = template["spec"]["containers"]
        assert env_of(container)[variable]["value"] == "0.0.0.0"
        assert [p["containerPort"] for p in container["ports"]] == [port]
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
        service = services[name]
        assert [p["port"] for p in service["spec"]["ports"]] == [port]
        assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    api = env_of(workloads["dispatcher"]["spec"]["template"]["spec"]["containers"][0])
    assert api["TRIALBUS_API_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "TRIALBUS_API_TOKEN"


@pytest.mark.parametrize("build", BUILDS)
def test_the_dispatcher_is_one_replica_never_two_at_once(rendered, build):
    dispatcher = of_kind(rendered[build], "Deployment")["dispatcher"]
    assert dispatcher["spec"]["replicas"] == 1
    assert dispatcher["spec"]["strategy"] == {"type": "Recreate"}


# ---------------------------------------------------------------- adapters


@pytest.mark.parametrize("build", BUILDS)
def test_adapters_keep_their_names_scale_up_on_cpu_and_have_disruption_budgets(rendered, build):
    docs = rendered[build]
    workloads, autoscalers = of_kind(docs, *WORKLOADS), of_kind(docs, "HorizontalPodAutoscaler").values()
    for name in ADAPTERS:
        adapter = workloads[name]
        # A restarted replica adopts only the trials launched under its own name: stable pod names.
        assert adapter["kind"] == "StatefulSet" and "replicas" not in adapter["spec"], name
        template = adapter["spec"]["template"]
        [container] = template["spec"]["containers"]
        env = env_of(container)
        assert env["TRIALBUS_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", name
        assert env["TRIALBUS_ADAPTER_HTTP_PORT"]["value"] == "9090", name
        assert env["TRIALBUS_ADAPTER_HTTP_HOST"]["value"] == "0.0.0.0", name
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, name
        assert {"name": "metrics", "containerPort": 9090} in container["ports"], name
        [hpa] = [h for h in autoscalers if h["spec"]["scaleTargetRef"]["name"] == name]
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet", name
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu", name
        assert hpa["spec"]["behavior"]["scaleDown"]["selectPolicy"] == "Disabled", name
        assert len(budgets_of(docs, template["metadata"]["labels"])) == 1, name
    # The workloads that are not adapters have budgets too.
    for name in ("dispatcher", "metrics-gateway", "nats"):
        assert len(budgets_of(docs, workloads[name]["spec"]["template"]["metadata"]["labels"])) == 1, name


def test_the_frameworkcontroller_adapter_runs_as_the_service_account_its_role_is_bound_to(rendered):
    docs = rendered["base"]
    rbac = {doc["kind"]: doc for doc in docs if doc["kind"] in ("ServiceAccount", "RoleBinding")}
    pod = of_kind(docs, "StatefulSet")["frameworkcontroller"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == rbac["ServiceAccount"]["metadata"]["name"]
    assert rbac["RoleBinding"]["subjects"][0]["name"] == pod["serviceAccountName"]


def test_the_frameworkcontroller_role_grants_exactly_what_the_adapter_uses():
    docs = {d["kind"]: d for d in yaml.safe_load_all((BASE / "frameworkcontroller-rbac.yaml").read_text())}
    rules = {
        (rule["apiGroups"][0], resource): set(rule["verbs"])
        for rule in docs["Role"]["rules"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("frameworkcontroller.microsoft.com", "frameworks"): {"create", "get", "list", "watch", "patch", "delete"},
        ("", "secrets"): {"create", "delete"},
        ("", "pods"): {"list"},  # with Kueue: whether a trial's pods are still gated
        ("kueue.x-k8s.io", "localqueues"): {"get"},  # with Kueue: whether a LocalQueue exists
    }
    binding = docs["RoleBinding"]
    assert binding["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": docs["ServiceAccount"]["metadata"]["name"],
            "namespace": docs["ServiceAccount"]["metadata"]["namespace"],
        }
    ]


# ---------------------------------------------------------------- NATS


@pytest.mark.parametrize("build", BUILDS)
def test_nats_is_a_cluster_of_three_on_volumes_routed_by_stable_names(rendered, build):
    docs = rendered[build]
    nats = of_kind(docs, "StatefulSet")["nats"]
    spec = nats["spec"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    [claim] = spec["volumeClaimTemplates"]
    [container] = spec["template"]["spec"]["containers"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]
    assert re.fullmatch(r"nats:2\.\d+\.\d+-alpine", container["image"])
    headless = of_kind(docs, "Service")[spec["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    conf = (BASE / "nats" / "nats.conf").read_text()
    routes = re.findall(r"nats://(nats-\d)\.([\w-]+):6222", conf)
    assert routes == [(f"nats-{i}", spec["serviceName"]) for i in range(3)]
    assert re.search(r"^\s*store_dir:\s*/data\s*$", conf, re.M) and re.search(r"^include auth\.conf$", conf, re.M)
    probes = {probe: container[probe]["httpGet"] for probe in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert all(get["port"] == "monitor" and get["path"].startswith("/healthz") for get in probes.values())
    [budget] = budgets_of(docs, spec["template"]["metadata"]["labels"])
    assert budget["spec"] == {"maxUnavailable": 1, "selector": budget["spec"]["selector"]}
    # The volume holds more than JetStream may write to it.
    size = env_of(container)["NATS_MAX_FILE_STORE"]["value"]
    assert _bytes(size) < _bytes(claim["spec"]["resources"]["requests"]["storage"])


def _bytes(size: str) -> int:
    """A Kubernetes quantity or a nats-server size (8G, 10Gi) in bytes."""
    number, prefix, binary = re.fullmatch(r"(\d+)([KMGT])(i?)", size).groups()
    return int(number) * (1024 if binary else 1000) ** ("KMGT".index(prefix) + 1)


def test_nats_server_accepts_its_configuration_with_the_pods_environment(rendered, tmp_path):
    # Given nats.conf and auth.conf as the pods mount them, with the environment the pods get
    binary = require_binary(nats_server_binary(), "nats-server")
    nats = of_kind(rendered["production"], "StatefulSet")["nats"]
    [container] = nats["spec"]["template"]["spec"]["containers"]
    env = {name: item.get("value") or f"{name.lower()}-value" for name, item in env_of(container).items()}
    env["SERVER_NAME"] = "nats-0"
    env["NATS_CALLOUT_ISSUER"] = new_issuer()[1]  # an account's public key, as its secret holds
    auth = (BASE / "nats" / "auth.conf").read_text()
    assert set(re.findall(r"\$(NATS_PASSWORD_\w+)", auth)) <= set(env), "a password auth.conf reads is not set"
    conf = (BASE / "nats" / "nats.conf").read_text()
    conf = conf.replace("/var/run/nats/", f"{tmp_path}/").replace("store_dir: /data", f"store_dir: {tmp_path}")
    (tmp_path / "nats.conf").write_text(conf)
    (tmp_path / "auth.conf").write_text(auth)
    # When nats-server checks it, then it is valid (every $VARIABLE resolved)
    result = subprocess.run(
        [binary, "-t", "-c", str(tmp_path / "nats.conf")], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- network policies


def _matches(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against labels."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        held = {
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
        }
        if not held[operator]:
            return False
    return True


def reaches(docs: list[dict], source: tuple[str, dict[str, str]], target: str, port: int) -> bool:
    """Whether the policies let a pod (namespace, labels) connect to ``port`` of workload ``target``."""
    namespace, labels = source
    target_labels = of_kind(docs, *WORKLOADS)[target]["spec"]["template"]["metadata"]["labels"]
    policies = [p for p in of_kind(docs, "NetworkPolicy").values() if _matches(p["spec"]["podSelector"], target_labels)]
    assert policies and all(p["metadata"]["namespace"] in of_kind(docs, "Namespace") for p in policies)
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            if "ports" in rule and not any(p["port"] == port for p in rule["ports"]):
                continue
            for peer in rule.get("from", [{"namespaceSelector": {}}]):
                if "namespaceSelector" in peer:
                    in_namespace = _matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
                else:
                    in_namespace = namespace == policy["metadata"]["namespace"]
                if in_namespace and _matches(peer.get("podSelector", {}), labels):
                    return True
    return False


@pytest.mark.parametrize("build", BUILDS)
def test_ingress_is_denied_by_default_and_opened_only_where_documented(rendered, build):
    docs = rendered[build]
    deny = of_kind(docs, "NetworkPolicy")["default-deny-ingress"]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}
    trial = {"trialbus.io/experiment": "exp1"}  # as the frameworkcontroller adapter labels trial pods
    tuner = {"trialbus.io/bus-client": "true"}
    somebody = {"app": "anything"}
    dispatcher = of_kind(docs, *WORKLOADS)["dispatcher"]["spec"]["template"]["metadata"]["labels"]
    nats_pod = of_kind(docs, *WORKLOADS)["nats"]["spec"]["template"]["metadata"]["labels"]
    adapter = of_kind(docs, *WORKLOADS)["local-gpu"]["spec"]["template"]["metadata"]["labels"]
    # Trial pods, in their experiment's namespace or in trialbus, reach the gateway and nothing else of ours.
    for namespace in ("research", "trialbus"):
        assert reaches(docs, (namespace, trial), "metrics-gateway", 8081)
        for target, port in (("dispatcher", 8080), ("nats", 4222), ("nats", 6222), ("local-gpu", 9090)):
            assert not reaches(docs, (namespace, trial), target, port), (namespace, target)
    # NATS: Trialbus's services and pods labelled as bus clients in the namespace; routes between NATS pods.
    assert reaches(docs, ("trialbus", dispatcher), "nats", 4222) and reaches(docs, ("trialbus", tuner), "nats", 4222)
    assert not reaches(docs, ("trialbus", somebody), "nats", 4222)
    assert not reaches(docs, ("elsewhere", tuner), "nats", 4222)
    assert reaches(docs, ("trialbus", nats_pod), "nats", 6222)
    assert not reaches(docs, ("trialbus", dispatcher), "nats", 6222)
    # The REST API from any other pod of the cluster, on its port only.
    assert reaches(docs, ("elsewhere", somebody), "dispatcher", 8080)
    assert not reaches(docs, ("elsewhere", somebody), "dispatcher", 9999)
    # The gateway from the adapters (local-gpu trials run in its pod), not from just anyone.
    assert reaches(docs, ("trialbus", adapter), "metrics-gateway", 8081)
    assert not reaches(docs, ("elsewhere", somebody), "metrics-gateway", 8081)
    # Metrics for Prometheus in namespace monitoring; nobody else calls the adapters.
    for target, port in (("nats", 8222), ("local-gpu", 9090), ("metrics-gateway", 8081)):
        assert reaches(docs, ("monitoring", somebody), target, port), target
    assert not reaches(docs, ("trialbus", dispatcher), "local-gpu", 9090)
