"""Routes on submitted jobs: list, detail, config, stop, tags, task attempts and their logs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from . import views
from .auth import ApiError, Caller
from .env import convert_name
from .render import masked
from .runner import Attempt, Job, Task

if TYPE_CHECKING:
    from .server import Emulator

MAX_LIMIT = 50000
_ORDER_FIELDS = {
    "jobName": lambda s: s["name"],
    "submissionTime": lambda s: s["submissionTime"],
    "username": lambda s: s["username"],
    "vc": lambda s: s["virtualCluster"],
    "retries": lambda s: s["retries"],
    "totalTaskNumber": lambda s: s["totalTaskNumber"],
    "totalGpuNumber": lambda s: s["totalGpuNumber"],
    "state": lambda s: s["state"],
    "completionTime": lambda s: s["completedTime"] or 0,
}
LOG_FILES = ("user.pai.stdout", "user.pai.stderr", "user.pai.all")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if "json" in request.headers.get("content-type", ""):
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise ApiError(400, "InvalidParametersError", "Unexpected token in JSON") from None
        return data if isinstance(data, dict) else {}
    return {k: v[0] for k, v in parse_qs(raw.decode(errors="replace")).items()}


def _int_param(request: Request, name: str, default: int, minimum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "InvalidParametersError", f'"{name}" must be a number') from None
    if value < minimum:
        raise ApiError(400, "InvalidParametersError", f'"{name}" must be larger than or equal to {minimum}')
    return value


class JobRoutes:
    """The ``/api/v2/jobs/...`` handlers, bound to one emulator."""

    def __init__(self, emu: Emulator) -> None:
        self.emu = emu

    def register(self, router: APIRouter) -> None:
        base = "/jobs/{framework_name}"
        task = base + "/attempts/{attempt_id}/taskRoles/{role}/taskIndex/{index}/attempts"
        router.add_api_route("/jobs", self.list_jobs, methods=["GET"])
        router.add_api_route(base, self.detail, methods=["GET"])
        router.add_api_route(base + "/attempts/{attempt_id}", self.attempt_detail, methods=["GET"])
        router.add_api_route(base + "/config", self.config, methods=["GET"])
        router.add_api_route(base + "/executionType", self.execution_type, methods=["PUT"])
        router.add_api_route(base + "/tag", self.add_tag, methods=["PUT"])
        router.add_api_route(base + "/tag", self.delete_tag, methods=["DELETE"])
        router.add_api_route(base + "/events", self.events, methods=["GET"])
        router.add_api_route(task, self.task_attempts, methods=["GET"])
        router.add_api_route(task + "/{task_attempt_id}/logs", self.task_logs, methods=["GET"])

    # ------------------------------------------------------------ lookups

    def _job(self, framework_name: str) -> Job:
        job = self.emu.runner.jobs.get(framework_name)
        if job is None:
            raise ApiError(404, "NoJobError", f"Job {framework_name} is not found.")
        return job

    def _owned(self, caller: Caller, job: Job) -> None:
        if caller.user != job.user and not caller.admin:
            raise ApiError(
                403,
                "ForbiddenUserError",
                f"User {caller.user} is not allowed to do operation on job {job.framework_name}.",
            )

    def _task(self, job: Job, attempt_id: str, role: str, index: str) -> tuple[Attempt, Task]:
        attempt = self.emu.runner.attempt(job, int(attempt_id)) if attempt_id.isdigit() else None
        for name, tasks in (attempt.tasks if attempt else {}).items():
            if role in (name, convert_name(name)) and index.isdigit() and int(index) < len(tasks):
                return attempt, tasks[int(index)]  # type: ignore[return-value]
        raise ApiError(
            404, "NoTaskError", f"Task {role}/{index} is not found in attempt {attempt_id} of {job.framework_name}."
        )

    # ------------------------------------------------------------ handlers

    async def list_jobs(self, request: Request) -> Any:
        self.emu.caller(request)
        if self.emu.faults.job_list_errors > 0:
            self.emu.faults.job_list_errors -= 1
            raise ApiError(500, "UnknownError", "emulated fault: the database is unavailable")
        q = request.query_params
        offset = _int_param(request, "offset", 0, minimum=0)
        limit = _int_param(request, "limit", 5000, minimum=1)
        if limit > MAX_LIMIT:
            raise ApiError(400, "InvalidParametersError", f'"limit" must be less than or equal to {MAX_LIMIT}')
        field, _, direction = q.get("order", "submissionTime,DESC").partition(",")
        if field not in _ORDER_FIELDS or direction.upper() not in ("", "ASC", "DESC"):
            raise ApiError(400, "InvalidParametersError", f'"order" {q.get("order")} is not valid')

        def csv(name: str) -> set[str]:
            return {v for v in q.get(name, "").split(",") if v}

        users, states, vcs = csv("username"), csv("state"), csv("vc")
        keyword, tags_in, tags_out = q.get("keyword"), csv("tagsContain"), csv("tagsNotContain")
        rows = []
        for job in self.emu.runner.jobs.values():
            row = views.job_summary(job)
            if f"{job.user}~{job.name}" in self.emu.faults.unknown:
                row["state"] = "UNKNOWN"
            if (
                (users and job.user not in users)
                or (states and row["state"] not in states)
                or (vcs and job.virtual_cluster not in vcs)
                or (tags_in and not tags_in & set(job.tags))
                or (tags_out and tags_out & set(job.tags))
                or (keyword and keyword not in job.name and keyword not in job.user)
            ):
                continue
            rows.append(row)
        rows.sort(key=_ORDER_FIELDS[field], reverse=direction.upper() != "ASC")
        page = rows[offset : offset + limit]
        if q.get("withTotalCount") == "true":
            return {"totalCount": len(rows), "data": page}
        return page

    async def detail(self, framework_name: str, request: Request) -> dict[str, Any]:
        self.emu.caller(request)
        found = views.job_detail(self._job(framework_name))
        if framework_name in self.emu.faults.unknown:
            found["jobStatus"]["state"] = "UNKNOWN"
        return found

    async def attempt_detail(self, framework_name: str, attempt_id: str, request: Request) -> dict[str, Any]:
        self.emu.caller(request)
        job = self._job(framework_name)
        attempt = self.emu.runner.attempt(job, int(attempt_id)) if attempt_id.isdigit() else None
        if attempt is None:
            raise ApiError(404, "NoJobError", f"JobAttemptId {attempt_id} is not found in {framework_name}.")
        return views.job_detail(job, attempt)

    async def config(self, framework_name: str, request: Request) -> Response:
        """JSON text served as text/yaml, as Express sends an object after ``type('text/yaml')``."""
        self.emu.caller(request)
        job = self.emu.runner.jobs.get(framework_name)
        if job is None:
            raise ApiError(404, "NoJobConfigError", f"Config of job {framework_name} is not found.")
        return Response(json.dumps(masked(job.config), default=str), media_type="text/yaml; charset=utf-8")

    async def execution_type(self, framework_name: str, request: Request) -> JSONResponse:
        caller = self.emu.caller(request)
        value = (await _body(request)).get("value")
        if value is None:
            raise ApiError(400, "InvalidParametersError", '"value" is required')
        if value not in ("START", "STOP"):
            raise ApiError(400, "InvalidParametersError", '"value" must be one of [START, STOP]')
        job = self._job(framework_name)
        self._owned(caller, job)
        if value == "STOP":
            self.emu.runner.stop(job)
        return JSONResponse({"status": 202, "message": f"Execute job {framework_name} successfully."}, status_code=202)

    async def add_tag(self, framework_name: str, request: Request) -> dict[str, str]:
        caller = self.emu.caller(request)
        tag = (await _body(request)).get("value")
        if not isinstance(tag, str) or not tag:
            raise ApiError(400, "InvalidParametersError", '"value" is required')
        job = self._job(framework_name)
        self._owned(caller, job)
        if tag not in job.tags:
            job.tags.append(tag)
        return {"message": f"Add tag {tag} for job {framework_name} successfully."}

    async def delete_tag(self, framework_name: str, request: Request) -> dict[str, str]:
        caller = self.emu.caller(request)
        tag = (await _body(request)).get("value")
        job = self._job(framework_name)
        self._owned(caller, job)
        if tag not in job.tags:
            raise ApiError(404, "NoTagError", f"Tag {tag} is not found in job {framework_name}.")
        job.tags.remove(tag)
        return {"message": f"Delete tag {tag} from job {framework_name} successfully."}

    async def events(self, framework_name: str, request: Request) -> dict[str, Any]:
        self.emu.caller(request)
        self._job(framework_name)
        return {"totalCount": 0, "data": []}

    async def task_attempts(
        self, framework_name: str, attempt_id: str, role: str, index: str, request: Request
    ) -> dict[str, Any]:
        self.emu.caller(request)
        job = self._job(framework_name)
        attempt, task = self._task(job, attempt_id, role, index)
        status = views.task_status(job, attempt, task)
        return {
            "username": job.user,
            "jobName": job.name,
            "jobAttemptId": attempt.id,
            "taskRoleName": convert_name(task.role),
            "taskIndex": task.index,
            "taskUid": task.uid,
            "taskState": status["taskState"],
            "retries": task.retries,
            "attempts": [status],
        }

    async def task_logs(
        self, framework_name: str, attempt_id: str, role: str, index: str, task_attempt_id: str, request: Request
    ) -> dict[str, Any]:
        self.emu.caller(request)
        job = self._job(framework_name)
        try:
            attempt, task = self._task(job, attempt_id, role, index)
        except ApiError:
            raise ApiError(404, "NoTaskLogError", f"Log of task {role}/{index} is not found.") from None
        if not task_attempt_id.isdigit() or int(task_attempt_id) > task.attempt_id:
            raise ApiError(404, "NoTaskLogError", f"Log of task attempt {task_attempt_id} is not found.")
        prefix = "/rest-server" if request.url.path.startswith("/rest-server") else ""
        base = f"{str(request.base_url).rstrip('/')}{prefix}/log-manager/{framework_name}/{attempt.id}"
        base += f"/{convert_name(task.role)}/{task.index}"
        return {"locations": [{"name": name.split(".")[-1], "uri": f"{base}/{name}"} for name in LOG_FILES]}

    async def log_file(self, path: str) -> PlainTextResponse:
        """The log-manager's part: a task's stdout, stderr or both (no token needed here)."""
        parts = path.split("/")
        job = self.emu.runner.jobs.get(parts[0]) if len(parts) == 5 else None
        if job is None or parts[4] not in LOG_FILES:
            raise ApiError(404, "NoTaskLogError", f"Log {path} is not found.")
        _, task = self._task(job, parts[1], parts[2], parts[3])
        names = ("user.pai.stdout", "user.pai.stderr") if parts[4] == "user.pai.all" else (parts[4],)
        files = [task.dir / n for n in names]
        return PlainTextResponse("".join(f.read_text(errors="replace") for f in files if f.exists()))
