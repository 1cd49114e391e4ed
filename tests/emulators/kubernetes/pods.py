"""Pods as local processes: the kubelet's part of the emulator.

A pod is built from a task's pod template with FC's ``{{FC_*}}`` placeholders replaced in every
string. When it can start, **every container in ``spec.containers``** runs as its own process
group: ``command + args`` (with Kubernetes' ``$(VAR)`` expansion), the host's environment plus
the FC_* variables (B.6) plus the container's ``env`` (``value``, ``secretKeyRef``, ``fieldRef``
on metadata), in ``workingDir`` (created if missing, as the container runtime does) or the pod's
own directory, stdout and stderr together in ``<state>/pods/<ns>/<pod>-<uid8>/<container>.log``.
Init containers are recorded, not run. Resources are recorded in the spec, not enforced.

A pod stays waiting (its task AttemptPreparing, as a pod stuck in ContainerCreating or
ImagePullBackOff) while: it has a scheduling gate (``spec.schedulingGates``: Kueue's, see
``kueue.py``, which an ``admission`` hook adds at creation); an image is in ``stuck_images``;
an ``nfs`` volume is not mapped by ``volumes``; an ``azureFile`` volume's secret (with
``azurestorageaccountname`` and ``azurestorageaccountkey``) is missing in the namespace, or its
share is not mapped; a ``secretKeyRef`` is missing; a mount path exists and is not our link, or is our link to another
folder in use by a running pod. Each ``volumeMounts[].mountPath`` of a mapped volume (``nfs``,
``azureFile``, ``hostPath``; others are ignored) becomes a symlink on this host to the local
folder (plus ``subPath``); links stay until shutdown, recorded under ``<state>/links``.

A running pod can also end for someone else's reason (``fail``, the emulator's test controls):
failed by the kubelet or the node controller with a ``status.reason`` (Evicted, Preempting,
NodeLost), or deleted by someone else (a drain, the scheduler's preemption). Its containers get
SIGTERM and SIGKILL after the grace period, or all die at once on a node that is gone. A
container's SIGKILL reaches every process it started, also those that left its process group
(a trial keeper starts its trial in a session of its own), as a container runtime's does.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .completion import ContainerExit

PLACEHOLDERS = (
    "FC_FRAMEWORK_NAMESPACE",
    "FC_FRAMEWORK_NAME",
    "FC_TASKROLE_NAME",
    "FC_TASK_INDEX",
    "FC_CONFIGMAP_NAME",
    "FC_POD_NAME",
)
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
SecretLookup = Callable[[str, str], dict[str, Any] | None]


def render_placeholders(value: Any, identity: dict[str, str]) -> Any:
    """``{{FC_…}}`` replaced anywhere in the template's strings (keys included)."""
    if isinstance(value, str):
        for name in PLACEHOLDERS:
            value = value.replace("{{" + name + "}}", identity[name])
        return value
    if isinstance(value, list):
        return [render_placeholders(v, identity) for v in value]
    if isinstance(value, dict):
        return {render_placeholders(k, identity): render_placeholders(v, identity) for k, v in value.items()}
    return value


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, an undefined one kept, ``$$`` is ``$``."""
    return _REFERENCE.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), str(text))


@dataclass
class Container:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Pod:
    """One task attempt's pod: its rendered spec, containers, links, and how its containers ended."""

    namespace: str
    name: str
    uid: str
    dir: Path
    spec: dict[str, Any]
    identity: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)  # the template's labels and annotations
    containers: list[Container] = field(default_factory=list)
    exits: list[ContainerExit] = field(default_factory=list)
    links: dict[Path, Path] = field(default_factory=dict)
    waiting: str | None = None  # why it has not started (diagnostics)
    started: bool = False
    term_sent_at: float | None = None
    #: How it ends for someone else's reason (``Kubelet.fail``): its ``status.reason`` and
    #: ``status.message`` as the kubelet or the node controller set them, or deleted by someone else.
    reason: str = ""
    message: str = ""
    deleted: bool = False
    kill_after: float | None = None  # seconds from SIGTERM to SIGKILL, when ``fail`` says

    @property
    def alive(self) -> bool:
        return any(c.proc is not None for c in self.containers)

    @property
    def ending(self) -> bool:
        """Failed or deleted by someone else: it stops, whatever its containers do."""
        return self.deleted or bool(self.reason)

    def render(self) -> dict[str, Any]:
        """The pod as the API lists it: FC's labels and annotations (B.6) over the template's, the spec,
        and a status phase (Pending until started, with ``SchedulingGated`` while gated)."""
        labels = {**(self.metadata.get("labels") or {})}
        labels |= {k: self.identity[k] for k in ("FC_FRAMEWORK_NAME", "FC_TASKROLE_NAME", "FC_TASK_INDEX")}
        annotations = {**(self.metadata.get("annotations") or {}), **self.identity}
        spec = copy.deepcopy(self.spec)
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            for kind in ("limits", "requests"):  # the apiserver's quantities are strings (``1`` → ``"1"``)
                found = (container.get("resources") or {}).get(kind) or {}
                found.update({name: str(value) for name, value in found.items()})
        conditions = []
        if not self.started:
            phase = "Pending"
            if self.spec.get("schedulingGates"):
                conditions.append({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"})
        elif self.alive:
            phase = "Running"
        else:
            phase = "Succeeded" if all(e.code == 0 for e in self.exits) else "Failed"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": spec,
            "status": {"phase": phase, "conditions": conditions},
        }

    def grace(self, default: float) -> float:
        if self.kill_after is not None:
            return self.kill_after
        value = self.spec.get("terminationGracePeriodSeconds")
        return float(value) if isinstance(value, int | float) and value >= 0 else default


class Kubelet:
    """Starts, watches and kills pods; maps volumes to local folders."""

    def __init__(
        self,
        state_dir: Path,
        volumes: dict[str, str],
        stuck_images: set[str],
        secret: SecretLookup,
        kill_grace: float = 2.0,
        admission: Callable[[Pod], None] | None = None,
    ) -> None:
        self.pods_dir, self.pgid_dir, self.link_dir = state_dir / "pods", state_dir / "pgids", state_dir / "links"
        for directory in (self.pods_dir, self.pgid_dir, self.link_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.volumes = {key.rstrip("/"): Path(local) for key, local in volumes.items()}
        self.stuck_images = set(stuck_images)
        self.secret = secret
        self.kill_grace = kill_grace
        self.admission = admission  # an admission webhook's change to each new pod (Kueue's gate)
        self.made_links: dict[Path, Path] = {}
        self.live: dict[str, Pod] = {}
        self.latest: dict[tuple[str, str], Pod] = {}  # (namespace, pod name) -> its newest pod, for logs

    def create(self, namespace: str, template: dict[str, Any], identity: dict[str, str]) -> Pod:
        rendered = render_placeholders(template, identity)
        spec, metadata = rendered.get("spec") or {}, rendered.get("metadata") or {}
        name, uid = identity["FC_POD_NAME"], identity["FC_POD_UID"]
        pod = Pod(namespace, name, uid, self.pods_dir / namespace / f"{name}-{uid[:8]}", spec, identity, metadata)
        if self.admission is not None:
            self.admission(pod)
        pod.dir.mkdir(parents=True, exist_ok=True)
        self.latest[(namespace, name)] = pod
        return pod

    # ------------------------------------------------------------ starting

    def try_start(self, pod: Pod) -> bool:
        """Start the pod's containers unless something keeps it waiting (``pod.waiting`` says what)."""
        waiting = self._gated(pod) or self._stuck(pod) or self._plan(pod)
        if waiting != pod.waiting and waiting is not None:
            print(f"pod {pod.namespace}/{pod.name} ({pod.uid}) waiting: {waiting}", file=sys.stderr, flush=True)
        pod.waiting = waiting
        if waiting is not None:
            return False
        for link, target in pod.links.items():
            self._link(link, target)
        for container in pod.containers:
            self._spawn(pod, container)
        pod.started = True
        self.live[pod.uid] = pod
        return True

    def _gated(self, pod: Pod) -> str | None:
        gates = [g.get("name") for g in pod.spec.get("schedulingGates") or []]
        return f"SchedulingGated: waiting for the scheduling gates {', '.join(gates)}" if gates else None

    def _stuck(self, pod: Pod) -> str | None:
        for c in [*(pod.spec.get("initContainers") or []), *(pod.spec.get("containers") or [])]:
            if c.get("image") in self.stuck_images:
                return f'ImagePullBackOff: Back-off pulling image "{c["image"]}"'
        return None

    def _plan(self, pod: Pod) -> str | None:
        volumes: dict[str, Path] = {}
        for volume in pod.spec.get("volumes") or []:
            local, waiting = self._volume(pod.namespace, volume)
            if waiting is not None:
                return f'ContainerCreating: MountVolume.SetUp failed for volume "{volume.get("name")}": {waiting}'
            if local is not None:
                volumes[volume.get("name", "")] = local
        pod.containers, pod.links = [], {}
        for spec in pod.spec.get("containers") or []:
            for mount in spec.get("volumeMounts") or []:
                if mount.get("name") in volumes:
                    target = volumes[mount["name"]] / (mount.get("subPath") or "")
                    waiting = self._link_blocked(Path(mount.get("mountPath", "")), target)
                    if waiting is not None:
                        return f"ContainerCreating: {waiting}"
                    pod.links[Path(mount["mountPath"])] = target
            env, waiting = self._env(pod, spec)
            if waiting is not None:
                return f"CreateContainerConfigError: {waiting}"
            argv = [expand(a, env) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
            cwd = Path(spec["workingDir"]) if spec.get("workingDir") else pod.dir
            name = spec.get("name") or f"container{len(pod.containers)}"
            pod.containers.append(Container(name, argv, env, cwd, pod.dir / f"{name}.log"))
        return None

    def _volume(self, namespace: str, volume: dict[str, Any]) -> tuple[Path | None, str | None]:
        """(local folder, None), or (None, why it cannot mount), or (None, None) for a type not mapped."""
        if "nfs" in volume:
            nfs = volume["nfs"] or {}
            server, path = nfs.get("server", ""), "/" + str(nfs.get("path", "")).strip("/")
            for key in sorted(self.volumes, key=len, reverse=True):
                prefix = f"nfs://{server}"
                if key.startswith(prefix) and (path + "/").startswith(key[len(prefix) :] + "/"):
                    return self.volumes[key] / path[len(key) - len(prefix) :].lstrip("/"), None
            return None, f"mount.nfs: access denied by server while mounting {server}:{path}"
        if "azureFile" in volume:
            azure = volume["azureFile"] or {}
            secret = self.secret(namespace, azure.get("secretName", ""))
            if secret is None:
                return None, f"Couldn't get secret {namespace}/{azure.get('secretName')}"
            if not {"azurestorageaccountname", "azurestorageaccountkey"} <= set(secret.get("data") or {}):
                return None, "could not find azurestorageaccountname or azurestorageaccountkey field in the secret"
            local = self.volumes.get(f"azurefile://{azure.get('shareName', '')}")
            return (local, None) if local else (None, f"mount error(2): No such file or directory ({azure})")
        if "hostPath" in volume:
            return Path((volume["hostPath"] or {}).get("path", "/")), None
        return None, None

    def _link_blocked(self, link: Path, target: Path) -> str | None:
        if not link.is_absolute():
            return f"mount path {str(link)!r} must be absolute"
        if link.is_symlink() and link.resolve() == target.resolve():
            return None
        if link.exists() or link.is_symlink():
            if link not in self.made_links:
                return f"refusing to replace {link}: it exists and is not a link this emulator made"
            for other in self.live.values():
                if other.alive and other.links.get(link, target) != target:
                    return f"{link} is mounted to {other.links[link]} by the running pod {other.name}"
        return None

    def _link(self, link: Path, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() == target.resolve():
            return
        link.unlink(missing_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
        self.made_links[link] = target
        record = self.link_dir / hashlib.sha1(str(link).encode()).hexdigest()  # noqa: S324 - a file name
        record.write_text(f"{link}\n{target}\n")

    def _env(self, pod: Pod, spec: dict[str, Any]) -> tuple[dict[str, str], str | None]:
        env = {**os.environ, **pod.identity, "HOSTNAME": pod.name}
        fields = {
            "metadata.name": pod.name,
            "metadata.namespace": pod.namespace,
            "metadata.uid": pod.uid,
            "spec.nodeName": "localhost",
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
        }
        for item in spec.get("env") or []:
            name, source = item.get("name", ""), item.get("valueFrom") or {}
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                data = (self.secret(pod.namespace, ref.get("name", "")) or {}).get("data") or {}
                if ref.get("key") not in data:
                    if ref.get("optional"):
                        continue
                    return env, f'secret "{ref.get("name")}" or its key "{ref.get("key")}" not found'
                env[name] = base64.b64decode(data[ref["key"]]).decode(errors="replace")
            elif "fieldRef" in source:
                env[name] = fields.get(source["fieldRef"].get("fieldPath", ""), "")
            else:
                env[name] = expand(item.get("value", ""), env)
        return env, None

    def _spawn(self, pod: Pod, container: Container) -> None:
        def cannot_run(code: int, message: str) -> None:
            pod.exits.append(ContainerExit(container.name, code, "ContainerCannotRun", message))

        if not container.argv:
            return cannot_run(
                127, "the emulator runs command and args only, not an image's entrypoint: executable file not found"
            )
        try:
            container.cwd.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return cannot_run(128, f'chdir to cwd ("{container.cwd}") failed: no such file or directory ({exc})')
        with container.log.open("ab") as log:
            try:
                container.proc = subprocess.Popen(
                    container.argv,
                    cwd=container.cwd,
                    env=container.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except FileNotFoundError:
                return cannot_run(127, f'exec: "{container.argv[0]}": executable file not found in $PATH')
            except PermissionError:
                return cannot_run(126, f'exec: "{container.argv[0]}": permission denied')
        (self.pgid_dir / str(container.proc.pid)).touch()
        return None

    # ------------------------------------------------------------ running and stopping

    def poll(self, pod: Pod) -> bool:
        """Record the containers that ended; True once none is left running."""
        for container in pod.containers:
            if container.proc is None or (rc := container.proc.poll()) is None:
                continue
            self._reap(container)
            sig = -rc if rc < 0 else 0
            code = 128 + sig if sig else rc
            pod.exits.append(ContainerExit(container.name, code, "Completed" if code == 0 else "Error", signal=sig))
        if not pod.alive:
            self.live.pop(pod.uid, None)
        return not pod.alive

    def _reap(self, container: Container) -> None:
        assert container.proc is not None
        _signal(container.proc.pid, signal.SIGKILL)  # a container ends with its main process
        (self.pgid_dir / str(container.proc.pid)).unlink(missing_ok=True)
        container.proc = None

    def stop(self, pod: Pod) -> bool:
        """Delete the pod: SIGTERM, then SIGKILL once its grace is over; True once nothing runs."""
        if self.poll(pod):
            return True
        now = time.monotonic()
        if pod.term_sent_at is None:
            pod.term_sent_at = now
            for c in pod.containers:
                if c.proc is not None:
                    _signal(c.proc.pid, signal.SIGTERM)
        elif now - pod.term_sent_at >= pod.grace(self.kill_grace):
            for c in pod.containers:
                if c.proc is not None:
                    _kill_all(c.proc.pid)
        return False

    def running(self, namespace: str, name: str) -> Pod | None:
        """The running pod of that name, unless it is ending already."""
        for pod in self.live.values():
            if (pod.namespace, pod.name) == (namespace, name) and pod.alive and not pod.ending:
                return pod
        return None

    def fail(self, pod: Pod, reason: str | None, message: str, grace: float | None) -> None:
        """End a running pod for someone else's reason: failed with ``status.reason`` ``reason``
        (and ``message``) by the kubelet or the node controller, or, with ``reason`` None, deleted
        by someone else. Its containers get SIGTERM now and SIGKILL after ``grace`` seconds (None:
        the pod's own grace period); with ``grace`` 0 every process of the pod dies at once, as
        on a node that is gone. The controller then completes its task (see ``completion``)."""
        pod.deleted, pod.reason, pod.message = reason is None, reason or "", message
        pod.kill_after = grace
        if grace == 0:
            for c in pod.containers:
                if c.proc is not None:
                    _kill_all(c.proc.pid)
        self.stop(pod)

    def log(self, namespace: str, name: str, container: str | None) -> str | None:
        """A container's log (the first container's by default); None when there is no such pod or container."""
        pod = self.latest.get((namespace, name))
        if pod is None:
            return None
        names = [c.get("name") for c in pod.spec.get("containers") or []]
        if container is None and names:
            container = names[0]
        if container not in names:
            return None
        path = pod.dir / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def shutdown(self) -> None:
        """Kill every process group still running and remove the links this emulator made."""
        for pod in list(self.live.values()):
            for c in pod.containers:
                if c.proc is not None:
                    _signal(c.proc.pid, signal.SIGKILL)
                    c.proc.wait()
                    self._reap(c)
        self.live.clear()
        for link, target in self.made_links.items():
            if link.is_symlink() and link.resolve() == target.resolve():
                link.unlink()
        for record in self.link_dir.glob("*"):
            record.unlink(missing_ok=True)


def _signal(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _kill_all(pid: int) -> None:
    """SIGKILL to a container's process group and to every process its main process started."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    _signal(pid, signal.SIGKILL)
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.kill()
