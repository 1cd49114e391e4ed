"""The REST verbs on Frameworks and Secrets (and Kueue's LocalQueues and ClusterQueues, when
served: ``kueue.py``), with the apiserver's status codes and checks; pods are listed
(``GET /api/v1/namespaces/{ns}/pods``, ``labelSelector``) as the simulated controller has them.

- create: 201 (JSON or YAML body); ``generateName`` honoured; 409 AlreadyExists; in a namespace
  outside ``namespaces`` (when the emulator was started with a list): 404 ``namespaces "x" not
  found``, as for a namespace that does not exist (reads there simply find nothing);
- get, list (``labelSelector``, ``fieldSelector`` on metadata.name/namespace; ``limit`` is
  ignored: every item comes in one page), watch (``watch.py``);
- replace (PUT): ``metadata.resourceVersion`` is required (422) and must be current (409);
- patch: JSON Patch and merge patch (415 for strategic merge on a Framework; a Secret takes it
  as a merge patch); a ``resourceVersion`` in the patch is a precondition (409);
- delete: 200 with the deleted object (a Framework) or a Success Status (a Secret);
  ``propagationPolicy`` and ``preconditions`` accepted;
- ``dryRun`` is refused (400) rather than ignored, so that nothing is persisted by surprise.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Callable
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from . import kueue, schema, status
from .patch import PatchError, apply
from .pods import Kubelet, Pod
from .resources import FRAMEWORKS, SECRETS, Resource
from .store import Obj, Store, selector
from .watch import watch

SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "generation", "deletionTimestamp", "selfLink")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
PODS = Resource("", "v1", "pods", "pod", "Pod", ())


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        if "yaml" in request.headers.get("content-type", ""):
            return yaml.safe_load(raw)
        return json.loads(raw or b"null")
    except (ValueError, yaml.YAMLError) as exc:
        raise status.bad_request(f"the body of the request could not be decoded: {exc}") from None


def _respond(obj: Any, code: int = 200, warnings: list[str] | None = None) -> JSONResponse:
    headers = [("Warning", f"299 - {json.dumps(w)}") for w in warnings or []]
    response = JSONResponse(obj, status_code=code)
    for name, value in headers:
        response.headers.append(name, value)
    return response


def _truthy(value: str | None) -> bool:
    return value in ("true", "1", "True")


class Api:
    """Handlers bound to one store, with the start options that change them."""

    def __init__(
        self,
        store: Store,
        kubelet: Kubelet,
        namespaces: set[str] | None,
        strict: bool,
        pods: Callable[[], list[Pod]] = list,
    ) -> None:
        self.store, self.kubelet, self.namespaces, self.strict = store, kubelet, namespaces, strict
        self.pods = pods  # the pods that exist now

    def register(self, app: FastAPI, serve_crd: bool, serve_kueue: bool = False) -> None:
        served = [SECRETS, *([FRAMEWORKS] if serve_crd else []), *([kueue.LOCALQUEUES] if serve_kueue else [])]
        if serve_kueue:
            base = f"{kueue.CLUSTERQUEUES.prefix}/{kueue.CLUSTERQUEUES.plural}"
            app.add_api_route(base, self._handler(kueue.CLUSTERQUEUES, self.collection), methods=["GET", "POST"])
            app.add_api_route(
                f"{base}/{{name}}",
                self._handler(kueue.CLUSTERQUEUES, self.item),
                methods=["GET", "PUT", "PATCH", "DELETE"],
            )
        app.add_api_route("/api/v1/namespaces/{namespace}/pods", self.list_pods, methods=["GET"])
        for res in served:
            base = f"{res.prefix}/namespaces/{{namespace}}/{res.plural}"
            app.add_api_route(base, self._handler(res, self.collection), methods=["GET", "POST"])
            app.add_api_route(
                f"{base}/{{name}}", self._handler(res, self.item), methods=["GET", "PUT", "PATCH", "DELETE"]
            )
            app.add_api_route(f"{res.prefix}/{res.plural}", self._handler(res, self.collection), methods=["GET"])
            app.add_api_route(
                f"{res.prefix}/watch/namespaces/{{namespace}}/{res.plural}",
                self._handler(res, self.collection, force_watch=True),
                methods=["GET"],
            )
            app.add_api_route(
                f"{res.prefix}/watch/{res.plural}",
                self._handler(res, self.collection, force_watch=True),
                methods=["GET"],
            )
        app.add_api_route("/api/v1/namespaces/{namespace}/pods/{name}/log", self.pod_log, methods=["GET"])

    def _handler(self, res: Resource, method: Any, force_watch: bool = False) -> Any:
        async def handle(request: Request) -> Response:
            if "dryRun" in request.query_params:
                raise status.bad_request("dryRun is not supported by the Kubernetes emulator")
            return await method(res, request, force_watch)

        return handle

    # ------------------------------------------------------------ collection: list, watch, create

    async def collection(self, res: Resource, request: Request, force_watch: bool) -> Response:
        namespace = request.path_params.get("namespace")
        if request.method == "POST":
            return await self.create(res, namespace, request)
        q = request.query_params
        by_selector = selector(q.get("labelSelector"), q.get("fieldSelector"))

        def match(obj: Obj) -> bool:
            return namespace in (None, obj["metadata"].get("namespace", "")) and by_selector(obj)

        if force_watch or _truthy(q.get("watch")):
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
            bookmarks = _truthy(q.get("allowWatchBookmarks"))
            return watch(self.store, res, match, q.get("resourceVersion"), timeout, bookmarks)
        rv = q.get("resourceVersion")
        if rv not in (None, "") and not rv.isdigit():
            raise status.bad_request(f"invalid resource version: {rv!r}")
        items = [copy.deepcopy(o) for o in self.store.list(res, namespace, match)]
        return _respond(
            {
                "apiVersion": res.api_version,
                "kind": f"{res.kind}List",
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": items,
            }
        )

    async def create(self, res: Resource, namespace: str | None, request: Request) -> Response:
        obj = self._admit(res, namespace, await _body(request), None)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
        if not meta.get("name"):
            raise status.invalid(
                res,
                "",
                [
                    status.cause(
                        "metadata.name", "Required value: name or generateName is required", "FieldValueRequired"
                    )
                ],
            )
        warnings = self._validate(res, obj, None, request)
        if self.store.get(res, namespace or "", meta["name"]) is not None:
            raise status.already_exists(res, meta["name"])
        created = self.store.create(res, obj, generation=res is FRAMEWORKS)
        return _respond(copy.deepcopy(created), 201, warnings)

    # ------------------------------------------------------------ item: get, replace, patch, delete

    async def item(self, res: Resource, request: Request, _: bool) -> Response:
        namespace, name = request.path_params.get("namespace", ""), request.path_params["name"]
        current = self.store.get(res, namespace, name)
        if current is None:
            if request.method in ("PUT", "PATCH") and res.namespaced:
                self._check_namespace(namespace)
            raise status.not_found(res, name)
        if request.method == "GET":
            return _respond(copy.deepcopy(current))
        if request.method == "DELETE":
            return await self.delete(res, current, request)
        body = await _body(request)
        if request.method == "PUT":
            obj = self._admit(res, namespace, body, current)
            if not obj["metadata"].get("resourceVersion"):
                raise status.invalid(
                    res,
                    name,
                    [status.cause("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")],
                )
        else:
            content_type = request.headers.get("content-type", "")
            try:
                patched = apply(content_type, copy.deepcopy(current), body, strategic_as_merge=res is SECRETS)
            except PatchError as exc:
                raise status.ApiError(422, "Invalid", str(exc)) from None
            obj = self._admit(res, namespace, patched, current)
        if obj["metadata"]["name"] != name:
            raise status.bad_request(
                f"the name of the object ({obj['metadata']['name']}) does not match the name on the URL ({name})"
            )
        if obj["metadata"].get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
            raise status.conflict(res, name)
        warnings = self._validate(res, obj, current, request)
        updated = self.store.update(res, obj, generation=res is FRAMEWORKS)
        return _respond(copy.deepcopy(updated), 200, warnings)

    async def delete(self, res: Resource, current: Obj, request: Request) -> Response:
        body = await _body(request) if await request.body() else {}
        options = body if isinstance(body, dict) else {}
        policy = request.query_params.get("propagationPolicy") or options.get("propagationPolicy")
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise status.bad_request(f"unknown propagationPolicy {policy!r}")
        meta = current["metadata"]
        preconditions = options.get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) not in (None, meta[key]):
                raise status.conflict(res, meta["name"])
        deleted = copy.deepcopy(self.store.delete(res, meta.get("namespace", ""), meta["name"]))
        if res.group:  # a custom resource answers with the object, as its CRD's endpoint does
            return _respond(deleted)
        return _respond(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": meta["name"], "kind": res.plural, "uid": meta["uid"]},
            }
        )

    # ------------------------------------------------------------ admission

    def _check_namespace(self, namespace: str) -> None:
        if self.namespaces is not None and namespace not in self.namespaces:
            raise status.namespace_not_found(namespace)

    def _admit(self, res: Resource, namespace: str | None, obj: Any, current: Obj | None) -> Obj:
        """The object's identity checks: kind, apiVersion, namespace; server-set metadata dropped on create."""
        if not isinstance(obj, dict):
            raise status.bad_request(
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: the body must be an object'
            )
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind is None and current is None and res is SECRETS:
            kind, api_version = obj.setdefault("kind", "Secret"), obj.setdefault("apiVersion", "v1")
        if kind != res.kind or api_version != res.api_version:
            raise status.bad_request(
                f"the API version in the data ({api_version}) and kind ({kind}) do not match "
                f"the expected {res.api_version} {res.kind}"
            )
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise status.bad_request("metadata must be an object")
        if not res.namespaced:  # cluster-scoped: a namespace in the object is dropped
            meta.pop("namespace", None)
        else:
            assert namespace is not None  # a namespaced resource's routes all name one
            if meta.get("namespace") not in (None, "", namespace):
                raise status.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            self._check_namespace(namespace)
            meta["namespace"] = namespace
        if current is None:
            for key in SERVER_SET:
                meta.pop(key, None)
        return obj

    def _validate(self, res: Resource, obj: Obj, current: Obj | None, request: Request) -> list[str]:
        """Check (and prune) ``obj`` in place; the warnings to send. ``?fieldValidation=Strict|Warn|Ignore``
        overrides the emulator's default for one request, as on a real apiserver."""
        if res is SECRETS:
            schema.check_secret(obj)
            return []
        if res.group == kueue.GROUP:
            kueue.check(res, obj)
            return []
        mode = request.query_params.get("fieldValidation") or ("Strict" if self.strict else "Warn")
        warnings = schema.check_framework(obj, mode == "Strict", current)
        return warnings if mode == "Warn" else []

    # ------------------------------------------------------------ pods

    async def list_pods(self, request: Request) -> Response:
        namespace = request.path_params["namespace"]
        by_selector = selector(request.query_params.get("labelSelector"), request.query_params.get("fieldSelector"))
        items = [p.render() for p in self.pods() if p.namespace == namespace]
        return _respond(
            {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": [p for p in items if by_selector(p)],
            }
        )

    async def pod_log(self, request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        text = self.kubelet.log(namespace, name, request.query_params.get("container"))
        if text is None:
            raise status.not_found(PODS, name)
        tail = request.query_params.get("tailLines")
        if tail and tail.isdigit():
            text = "".join(text.splitlines(keepends=True)[-int(tail) :]) if int(tail) else ""
        return PlainTextResponse(text)
