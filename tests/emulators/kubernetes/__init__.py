"""An emulator of the Kubernetes API with FrameworkController's ``Framework`` resource, run as its
own process for tests (reference: platform-apis.md part B).

``start_kubernetes`` launches ``python -m tests.emulators.kubernetes`` on a free port, waits until
it answers, and returns a ``Kubernetes`` handle (use it as a context manager, or call ``stop()``). The
official ``kubernetes`` client talks to it unchanged, through ``handle.configuration()`` (a
``Configuration(host=url)`` with the bearer token) or a kubeconfig file (``handle.kubeconfig(path)``).

What it serves (each module's docstring has the details):

- discovery (``/api``, ``/api/v1``, ``/apis``, the FC group and version), ``/version``;
- Frameworks (``/apis/frameworkcontroller.microsoft.com/v1/...``) and Secrets (``/api/v1/...``):
  create, get, list, watch, replace, patch, delete, with real metadata and ``Status`` errors
  (``api.py``, ``watch.py``, ``patch.py``), validated against the CRD schema (``schema.py``);
- a simulated FrameworkController that runs each task's pod as local processes (``controller.py``,
  ``pods.py``) and writes FC's ``status``; pod logs at ``/api/v1/namespaces/{ns}/pods/{pod}/log``;
- with ``kueue=True``, Kueue: LocalQueues and ClusterQueues, and pods with Kueue's queue label
  gated until their ClusterQueue has quota for them (``kueue.py``); the pods that exist are
  listed at ``/api/v1/namespaces/{ns}/pods``;
- test controls: ``drop_watches()``, ``compact()``, ``requests()``, and pods that end for someone
  else's reason: ``lose_node(pod)``, ``evict(pod)``, ``delete_pod(pod)`` (``server.py``).

Volumes: ``volumes={"nfs://<server><path>": "/local/dir", "azurefile://<shareName>": "/local/dir"}``.
A pod's ``nfs`` volume maps to the longest matching key (a sub-path of an exported path maps to
the same sub-folder); an ``azureFile`` volume needs its secret in the namespace. Each
``volumeMounts[].mountPath`` of a mapped volume becomes a symlink on this host to the local folder.

    k8s = start_kubernetes(tmp_path, token="t0ken", volumes={"nfs://nfs.local/exports": str(share)})
    api = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(k8s.configuration()))
    api.create_namespaced_custom_object("frameworkcontroller.microsoft.com", "v1", "default", "frameworks", body)
    k8s.stop()                  # the server, every pod process group, every link it made

Run on its own (prints the kubeconfig to use): ``python -m tests.emulators.kubernetes --port 8080
--volume nfs://nfs.local/exports=/tmp/share`` (``--help`` lists every option).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.emulators.processes import free_port, stop_server

from .kubeconfig import kubeconfig_yaml

if TYPE_CHECKING:
    from kubernetes.client import Configuration

REPO_ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT = 20.0


class Kubernetes:
    """A running emulator: its URL and token, client settings, test controls, log, and ``stop``."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, token: str | None, state_dir: Path) -> None:
        self.process = process
        self.url = url
        self.token = token
        self.state_dir = state_dir

    def configuration(self) -> Configuration:
        """A ``kubernetes.client.Configuration`` for this emulator (host and bearer token)."""
        from kubernetes.client import Configuration

        config = Configuration(host=self.url)
        if self.token:
            config.api_key = {"BearerToken": self.token}
            config.api_key_prefix = {"BearerToken": "Bearer"}
        return config

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """Write a kubeconfig (server, token, a context with ``namespace`` as default) to ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(kubeconfig_yaml(self.url, self.token, namespace))
        path.chmod(0o600)
        return path

    def drop_watches(self) -> int:
        """Close every open watch stream at once; the number closed."""
        return int(self._control("post", "drop-watches")["dropped"])

    def compact(self) -> int:
        """Forget the write history: watching from an older resourceVersion now gets 410. The current one."""
        return int(self._control("post", "compact")["resourceVersion"])

    def requests(self) -> list[dict[str, Any]]:
        """The API requests served so far: ``{method, path, query, agent, status}`` (``agent``: the
        User-Agent header), oldest first."""
        return self._control("get", "requests")

    def lose_node(self, pod: str, namespace: str = "default") -> None:
        """The node running ``pod`` is gone: every process of the pod dies at once and the node
        controller fails the pod with reason ``NodeLost`` (FC: −1001 PodNodeLost, Transient)."""
        message = f"Node localhost which was running pod {pod} is unresponsive"
        self._fail(namespace, pod, {"reason": "NodeLost", "message": message, "grace": 0})

    def evict(self, pod: str, reason: str = "Evicted", namespace: str = "default") -> None:
        """The kubelet stops ``pod`` (SIGTERM, SIGKILL after its grace period) and fails it with
        ``reason``: ``Evicted`` (node pressure; FC: −1000 PodEvicted) or ``Preempting`` (to admit a
        critical pod; FC: −1003 PodPreemptedForCriticalPod), both Transient."""
        message = {
            "Evicted": "The node was low on resource: memory.",
            "Preempting": "Preempted in order to admit critical pod",
        }.get(reason, "")
        self._fail(namespace, pod, {"reason": reason, "message": message, "grace": None})

    def delete_pod(self, pod: str, namespace: str = "default") -> None:
        """Someone deletes ``pod`` (a drain, the scheduler preempting it for a pod of higher
        priority, ``kubectl delete pod``): SIGTERM, SIGKILL after its grace period; FC completes
        its task with −101 PodExternalDeleted (Transient)."""
        self._fail(namespace, pod, {"reason": None, "grace": None})

    def _fail(self, namespace: str, pod: str, body: dict[str, Any]) -> None:
        self._control("post", f"pods/{namespace}/{pod}/fail", body)

    def _control(self, method: str, name: str, body: dict[str, Any] | None = None) -> Any:
        r = httpx.request(method.upper(), f"{self.url}/emulator/{name}", json=body, timeout=10)
        r.raise_for_status()
        return r.json()

    def log(self) -> str:
        """The emulator's own stdout and stderr."""
        path = self.state_dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop the server, then kill every pod process group and remove every mount link it recorded
        (also after a crash). Idempotent."""
        stop_server(self.process, self.state_dir)
        for record in (self.state_dir / "links").glob("*"):
            link, _, target = record.read_text().partition("\n")
            if Path(link).is_symlink() and Path(link).resolve() == Path(target.strip()).resolve():
                Path(link).unlink()
            record.unlink(missing_ok=True)

    def __enter__(self) -> Kubernetes:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _command(
    port: int,
    state_dir: Path,
    token: str | None,
    volumes: Mapping[str, str],
    stuck_images: Iterable[str],
    namespaces: Iterable[str] | None,
    strict: bool,
    serve_crd: bool,
    tick: float,
    history_limit: int,
    kill_grace: float,
    kueue: bool = False,
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "tests.emulators.kubernetes",
        "--port",
        str(port),
        "--state",
        str(state_dir),
        "--tick",
        str(tick),
        "--history-limit",
        str(history_limit),
        "--kill-grace",
        str(kill_grace),
        "--quiet",
    ]
    cmd += ["--token", token] if token else []
    cmd += [arg for key, local in volumes.items() for arg in ("--volume", f"{key}={local}")]
    cmd += [arg for image in stuck_images for arg in ("--stuck-image", image)]
    cmd += [arg for ns in namespaces for arg in ("--namespace", ns)] if namespaces is not None else []
    cmd += ["--strict"] if strict else []
    cmd += [] if serve_crd else ["--no-crd"]
    cmd += ["--kueue"] if kueue else []
    return cmd


def start_kubernetes(
    state_dir: Path,
    *,
    token: str | None = None,
    volumes: Mapping[str, str] | None = None,
    stuck_images: Iterable[str] = (),
    namespaces: Iterable[str] | None = None,
    strict: bool = False,
    serve_crd: bool = True,
    tick: float = 0.05,
    history_limit: int = 5000,
    kill_grace: float = 2.0,
    kueue: bool = False,
) -> Kubernetes:
    """Start an emulator on a free port and wait until it answers.

    ``token``: the bearer token every API request needs (None: no auth). ``volumes``: local
    folders for ``nfs://<server><path>`` and ``azurefile://<shareName>`` volumes. ``stuck_images``:
    images whose pods never start. ``namespaces``: the namespaces that exist (None: any).
    ``strict``: reject undeclared Framework fields (400) instead of pruning them. ``serve_crd=False``:
    a cluster without FrameworkController. ``tick``: seconds between controller steps.
    ``history_limit``: writes a watch can resume across. ``kill_grace``: seconds from SIGTERM to
    SIGKILL for a pod without ``terminationGracePeriodSeconds``. ``kueue``: Kueue is installed.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    namespaces = list(namespaces) if namespaces is not None else None
    for _ in range(3):  # another process may take the free port before the server binds it
        port = free_port()
        cmd = _command(
            port,
            state_dir,
            token,
            dict(volumes or {}),
            list(stuck_images),
            namespaces,
            strict,
            serve_crd,
            tick,
            history_limit,
            kill_grace,
            kueue,
        )
        with (state_dir / "server.log").open("ab") as log:
            process = subprocess.Popen(
                cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        k8s = Kubernetes(process, f"http://127.0.0.1:{port}", token, state_dir)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{k8s.url}/healthz", timeout=1).status_code == 200:
                    return k8s
            time.sleep(0.05)
        k8s.stop()
        if "address already in use" not in k8s.log():
            break
    raise RuntimeError(f"the Kubernetes emulator did not start:\n{k8s.log()}")
