"""Kubernetes as the frameworkcontroller adapter uses it: the official ``kubernetes`` client
(blocking, so every call runs in a worker thread and the event loop never waits on it).

The configuration is found as ``kubectl`` finds it: ``TRIALBUS_KUBECONFIG``, else
``KUBECONFIG``, else ``~/.kube/config``, else the pod's service account (in-cluster).
:func:`error_of` turns every answer of the API server into the adapter's error classes in
one place: 401/403 (credentials, RBAC: permanent, saying which verb and resource), 404, 409,
422 (the server's validation message), 5xx and network errors (transient).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from services.adapters.errors import AdapterError, PermanentError, TransientError

GROUP, VERSION, PLURAL = "frameworkcontroller.microsoft.com", "v1", "frameworks"
KUEUE_GROUP = "kueue.x-k8s.io"


class Conflict(AdapterError):
    """409: an object of that name exists."""


class Gone(AdapterError):
    """410: the watch's resourceVersion is too old; list again."""


class Kubernetes:
    """One cluster, through one ``ApiClient``."""

    def __init__(self, kubeconfig: Path | None, timeout: float) -> None:
        from kubernetes import client, config

        self.timeout = timeout
        path = kubeconfig or (
            Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
            if os.environ.get("KUBECONFIG")
            else Path("~/.kube/config").expanduser()
        )
        try:
            if path.is_file():
                self.api = config.new_client_from_config(config_file=str(path))
                self.where = f"the cluster of {path}"
            elif os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
                self.api = client.ApiClient()
                self.where = "this pod's cluster"
            else:
                raise PermanentError(
                    f"no Kubernetes configuration: {path} does not exist and this is not a pod; "
                    "set KUBECONFIG (or TRIALBUS_KUBECONFIG) to a kubeconfig file"
                )
        except config.ConfigException as exc:
            raise PermanentError(f"cannot read the Kubernetes configuration {path}: {exc}") from None
        self.server = self.api.configuration.host
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self._streams: set[Any] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for stream in list(self._streams):
                with contextlib.suppress(Exception):
                    stream.shutdown()
        with contextlib.suppress(Exception):
            self.api.close()

    async def call(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a thread; API errors as adapter errors."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            raise error_of(exc.status, exc.body, doing) from None
        except (HTTPError, OSError) as exc:
            raise TransientError(
                f"cannot reach the Kubernetes API server at {self.server} while {doing}: {exc}", delay=2.0
            ) from None

    # ------------------------------------------------------------------ frameworks

    async def create(self, namespace: str, body: dict) -> dict:
        name = body["metadata"]["name"]
        return await self.call(
            f"creating Framework {namespace}/{name}",
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            body,
        )

    async def get(self, namespace: str, name: str) -> dict | None:
        try:
            return await self.call(
                f"reading Framework {namespace}/{name}",
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
            )
        except NotFound:
            return None

    async def list(self, namespace: str, selector: str) -> tuple[list[dict], str]:
        """The Frameworks matching ``selector`` and the list's resourceVersion (to watch from)."""
        found = await self.call(
            f"listing Frameworks in namespace {namespace}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            label_selector=selector,
        )
        return found.get("items") or [], str((found.get("metadata") or {}).get("resourceVersion") or "")

    async def stop(self, namespace: str, name: str) -> None:
        """``executionType: Stop`` (merge patch); a Framework already gone is no error."""
        with contextlib.suppress(NotFound):
            await self.call(
                f"stopping Framework {namespace}/{name}",
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"spec": {"executionType": "Stop"}},
                _content_type="application/merge-patch+json",
            )

    async def delete(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.call(
                f"deleting Framework {namespace}/{name}",
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                propagation_policy="Foreground",
            )

    def watch(self, namespace: str, selector: str, resource_version: str, seconds: int) -> Iterator[dict]:
        """Events of the Frameworks matching ``selector`` after ``resource_version``, for at most
        ``seconds`` (blocking: run it in a thread). Gone when the version is too old."""
        from kubernetes.client.exceptions import ApiException
        from urllib3 import HTTPResponse

        try:
            # The generated client types every answer ``object``; unread (``_preload_content=False``), it is
            # urllib3's response.
            response = cast(
                HTTPResponse,
                self.custom.list_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    label_selector=selector,
                    watch=True,
                    resource_version=resource_version or None,
                    allow_watch_bookmarks=True,
                    timeout_seconds=seconds,
                    _preload_content=False,
                    _request_timeout=(self.timeout, seconds + self.timeout),
                ),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(f"resourceVersion {resource_version} is too old") from None
            raise error_of(exc.status, exc.body, f"watching Frameworks in namespace {namespace}") from None
        with self._lock:
            self._streams.add(response)
        try:
            buffer = b""
            for chunk in response.stream(65536, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            status = event.get("object") or {}
                            if status.get("code") == 410:
                                raise Gone(str(status.get("message")))
                            raise TransientError(f"watch error: {status.get('message')}", delay=1.0)
                        yield event
        finally:
            with self._lock:
                self._streams.discard(response)
            response.release_conn()

    # ------------------------------------------------------------------ pods, Kueue

    async def pods(self, namespace: str, framework: str) -> builtins.list[dict]:
        """The pods FrameworkController made for the Framework ``framework`` (its label
        ``FC_FRAMEWORK_NAME``), as plain JSON (``spec.schedulingGates`` read as sent)."""
        response = await self.call(
            f"listing the pods of Framework {namespace}/{framework}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=f"FC_FRAMEWORK_NAME={framework}",
            _preload_content=False,
        )
        return json.loads(response.data).get("items") or []

    async def kueue_version(self) -> str | None:
        """The version of ``kueue.x-k8s.io`` the API server prefers; None when Kueue is not installed."""
        from kubernetes import client

        groups = await self.call("reading the API groups", client.ApisApi(self.api).get_api_versions)
        for group in groups.groups or []:
            if group.name == KUEUE_GROUP:
                return group.preferred_version.version if group.preferred_version else group.versions[0].version
        return None

    async def local_queue(self, namespace: str, name: str, version: str) -> dict | None:
        """The Kueue LocalQueue ``namespace/name``; None when it does not exist."""
        try:
            return await self.call(
                f"reading Kueue LocalQueue {namespace}/{name}",
                self.custom.get_namespaced_custom_object,
                KUEUE_GROUP,
                version,
                namespace,
                "localqueues",
                name,
            )
        except NotFound:
            return None

    # ------------------------------------------------------------------ secrets, discovery

    async def create_secret(self, namespace: str, body: dict) -> None:
        name = body["metadata"]["name"]
        with contextlib.suppress(Conflict):
            await self.call(f"creating Secret {namespace}/{name}", self.core.create_namespaced_secret, namespace, body)

    async def delete_secret(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.call(f"deleting Secret {namespace}/{name}", self.core.delete_namespaced_secret, name, namespace)

    async def check(self, namespace: str, selector: str) -> builtins.list[str]:  # ``list``: the method above
        """What stops the adapter from running Frameworks in ``namespace``: no FrameworkController
        CRD, no permission to list Frameworks there."""
        try:
            resources = await self.call(f"reading the API group {GROUP}", self.custom.get_api_resources, GROUP, VERSION)
        except NotFound:
            return [
                f"{self.server} does not serve {GROUP}/{VERSION}: FrameworkController is not installed in this "
                "cluster (it creates its CRD when it starts)"
            ]
        except (TransientError, PermanentError) as exc:
            return [str(exc)]
        if PLURAL not in {r.name for r in resources.resources}:
            return [f"{self.server} serves {GROUP}/{VERSION} without the resource {PLURAL}"]
        try:
            await self.list(namespace, selector)
        except (TransientError, PermanentError) as exc:
            return [str(exc)]
        return []


class NotFound(PermanentError):
    """404."""


def error_of(status: int | None, body: Any, doing: str) -> AdapterError:
    """The adapter error for an API server answer (a ``Status`` object in ``body``)."""
    try:
        found = json.loads(body) if isinstance(body, str | bytes) else body or {}
        message, reason = str(found.get("message", "")), str(found.get("reason", ""))
    except (ValueError, AttributeError):
        message, reason = str(body)[:300], ""
    if status == 401:
        return PermanentError(
            f"the Kubernetes API server refused the credentials while {doing} (401: {message}); "
            "check the kubeconfig's user or the service account token"
        )
    if status == 403:
        return PermanentError(
            f"Kubernetes forbids {doing} (403: {message}); grant the adapter's service account "
            "the Role in k8s/base/frameworkcontroller-rbac.yaml"
        )
    if status == 404:
        return NotFound(f"not found while {doing} (404: {message})")
    if status == 409:
        return Conflict(f"{doing}: it exists already (409 {reason})")
    if status in (400, 422):
        return PermanentError(f"Kubernetes refused {doing} ({status} {reason}: {message})")
    if status == 410:
        return Gone(message)
    if status is not None and (status >= 500 or status == 429):
        return TransientError(f"the Kubernetes API server failed {doing} ({status}: {message})", delay=2.0)
    return PermanentError(f"unexpected answer {status} from the Kubernetes API server while {doing}: {message}")
