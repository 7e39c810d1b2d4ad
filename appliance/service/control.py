"""The control API's routes (FastAPI), each short; one handler maps the project's errors to HTTP.

The caller's uid and pid come from SO_PEERCRED (server.py puts them in the
connection's ASGI state); a request without them is refused before routing,
except on the optional TCP control port, where it must carry the daemon's
bearer token instead (compared in constant time; a refusal is a 401, audited).
Every mutating call is written to the audit log with its outcome, refusals
included. Files of a job (metrics, samples, judge log, log.txt) are read from
its job folder, which the worker writes; the job store holds states and events.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from appliance import __version__
from appliance.errors import ApplianceError
from appliance.service.api import (
    JOB_ID_PATTERN,
    CheckpointInfo,
    DaemonStatus,
    DeviceStatus,
    ErrorResponse,
    EventsPage,
    ExportRequest,
    ExportResponse,
    JobDetail,
    JobList,
    JobSummary,
    LogChunk,
    MetricsPage,
    ModelInfo,
    ModelList,
    RecordsPage,
    SubmitRequest,
    SubmitResponse,
    EndpointInfo,
    TrajectoriesAccepted,
    TrajectorySubmission,
)
from appliance.service.audit import user_name
from appliance.service.job_files import records_after_step, tail_records
from appliance.service.store import BadTransition, StoreUnwritable, UnknownJob
from appliance.service.submission import SubmissionRejected
from appliance.paths import exports_dir

if TYPE_CHECKING:
    from appliance.service.daemon import Daemon

MAX_LONG_POLL_SECONDS = 60.0
CHECKPOINT_DIR = re.compile(r"^step-(\d+)$")


class BadJobId(ApplianceError):
    pass


class Unauthenticated(ApplianceError):
    pass


class Forbidden(ApplianceError):
    """The caller may see the job but not act on it."""


class EventBus:
    """Wakes long-polls when the store appends an event (notify may come from any thread)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Future] = set()

    def notify(self, _event_id: int = 0) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait(self, timeout: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)


TCP_UID = -1  # the owner recorded for a job submitted over TCP: a token holder, not a Unix user


class PeerCredentials:
    """Pure ASGI middleware: refuse any request whose connection carries no SO_PEERCRED reading, unless it
    came over the TCP control port with the right bearer token (`token` set only when that port exists)."""

    def __init__(self, app, token: str | None = None, audit=None) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.audit = audit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.get("state") or {}
        if state.get("peer"):
            await self.app(scope, receive, send)
            return
        remote = state.get("remote")
        if remote and self.token is not None:
            problem = self._token_problem(scope)
            if problem is None:
                await self.app(scope, receive, send)
                return
            if self.audit is not None:
                what = f"refused: {problem} ({scope['method']} {scope['path'][:MAX_AUDIT_PATH]})"
                await asyncio.to_thread(self.audit.refused_tcp, remote, what)
            response = JSONResponse(
                ErrorResponse(
                    error=f"{problem}; send 'Authorization: Bearer <token>' with "
                    "the token of the daemon's --control-token-file"
                ).model_dump(),
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        response = JSONResponse(
            ErrorResponse(
                error="the caller's credentials could not be read from the "
                "connection; connect over the daemon's Unix socket"
            ).model_dump(),
            status_code=403,
        )
        await response(scope, receive, send)

    def _token_problem(self, scope) -> str | None:
        values = [value for name, value in scope.get("headers", []) if name == b"authorization"]
        if not values:
            return "no bearer token"
        scheme, _, given = values[-1].partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            return "no bearer token"
        if not secrets.compare_digest(given.strip(), self.token):
            return "wrong bearer token"
        return None


MAX_AUDIT_PATH = 200
MAX_RECORDS = 1000  # the most records one page of samples or judge calls holds


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Pure ASGI middleware: a body over `max_bytes` is a 413, from Content-Length before anything is read,
    else as soon as the streamed chunks pass the limit (never buffered whole)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [value for name, value in scope.get("headers", []) if name == b"content-length"]
        if declared and (not declared[-1].isdigit() or int(declared[-1]) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        seen, started, refused = 0, False, False

        async def limited_receive():
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                if not started and not refused:
                    refused = True  # answered here: whatever the app makes of the error below is dropped
                    await self._refuse(scope, receive, send)
                raise _BodyTooLarge
            return message

        async def watched_send(message):
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except _BodyTooLarge:
            pass

    async def _refuse(self, scope, receive, send) -> None:
        message = f"the request body is over this daemon's limit of {self.max_bytes} bytes"
        await JSONResponse(ErrorResponse(error=message).model_dump(), status_code=413)(scope, receive, send)


class AuditRefusals:
    """Pure ASGI middleware: every 4xx answer not already audited by its route is written to the audit log."""

    def __init__(self, app, audit) -> None:
        self.app, self.audit = app, audit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def watched_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watched_send)
        state = scope.get("state") or {}
        if 400 <= status < 500 and not state.get("audited"):
            pid, uid, _gid = state.get("peer") or (None, None, None)
            how = {"transport": "unix"} if state.get("peer") else {"transport": "tcp", "remote": state.get("remote")}
            where = f"{scope['method']} {scope['path'][:MAX_AUDIT_PATH]}"
            await asyncio.to_thread(
                self.audit.record,
                uid=uid,
                pid=pid,
                action="request",
                job_id=None,
                outcome=f"refused: {status} ({where})",
                durable=False,
                **how,
            )


def _status_of(error: ApplianceError) -> int:
    if isinstance(error, SubmissionRejected):
        return error.status
    if isinstance(error, UnknownJob):
        return 404
    if isinstance(error, BadTransition):
        return 409
    if isinstance(error, (Unauthenticated, Forbidden)):
        return 403
    if isinstance(error, StoreUnwritable):
        return 507  # Insufficient Storage: reads still work; the message says what to free
    return 400  # BadJobId and any other ApplianceError: bad input the caller can correct


def caller_groups(pid: int, gid: int) -> set[int]:
    """The peer process's primary and supplementary groups, read from /proc while its connection is open."""
    groups = {gid}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                groups.update(int(value) for value in line.split()[1:])
    except (OSError, ValueError):
        pass
    return groups


def may_act(state: dict, owner_uid: int, admin_gid: int | None) -> bool:
    """Owner, root, the admin group, or a TCP token holder (the administrator's token) may act on a job."""
    credentials = state.get("peer")
    if not credentials:
        return state.get("remote") is not None  # passed PeerCredentials with the daemon's bearer token
    pid, uid, gid = credentials
    if uid in (0, owner_uid):
        return True
    return admin_gid is not None and admin_gid in caller_groups(pid, gid)


def create_app(daemon: "Daemon", control_token: str | None = None, admin_gid: int | None = None) -> FastAPI:
    app = FastAPI(title="appliance control API", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_bytes=2 * daemon.policy.max_upload_bytes + (1 << 20))
    app.add_middleware(AuditRefusals, audit=daemon.audit)
    app.add_middleware(PeerCredentials, token=control_token, audit=daemon.audit)
    store, bus = daemon.store, daemon.bus

    @app.exception_handler(ApplianceError)
    async def appliance_error(_request: Request, error: ApplianceError) -> JSONResponse:
        body = ErrorResponse(
            error=str(error).splitlines()[0] if str(error) else type(error).__name__,
            errors=error.items() if isinstance(error, SubmissionRejected) else [],
            plan=error.plan if isinstance(error, SubmissionRejected) else None,
        )
        return JSONResponse(body.model_dump(), status_code=_status_of(error))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = (
            f"no API route {request.method} {request.url.path}"
            if error.status_code in (404, 405)
            else str(error.detail)
        )
        return JSONResponse(ErrorResponse(error=message).model_dump(), status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"bad request: {where + ': ' if where else ''}{first.get('msg', 'invalid')}"
        return JSONResponse(ErrorResponse(error=message).model_dump(), status_code=422)

    def peer(request: Request) -> tuple[int | None, int | None]:
        """(uid, pid) of a Unix-socket caller; (None, None) on the TCP control port."""
        credentials = request.scope["state"].get("peer")
        if not credentials:
            return None, None
        pid, uid, _gid = credentials
        return uid, pid

    def transport(request: Request) -> dict:
        """The audit fields that say how the caller came in."""
        if request.scope["state"].get("peer"):
            return {"transport": "unix"}
        return {"transport": "tcp", "remote": request.scope["state"].get("remote")}

    def audited(request: Request, action: str, job_id: str | None, call):
        request.state.audited = True  # AuditRefusals need not write this call again
        uid, pid = peer(request)
        how = transport(request)
        try:
            result = call()
        except ApplianceError as error:
            daemon.audit.record(
                uid=uid,
                pid=pid,
                action=action,
                job_id=job_id,
                outcome=f"refused: {str(error).splitlines()[0] if str(error) else ''}",
                **how,
            )
            raise
        except Exception as error:
            daemon.audit.record(uid=uid, pid=pid, action=action, job_id=job_id, outcome=f"error: {error}", **how)
            raise
        daemon.audit.record(
            uid=uid,
            pid=pid,
            action=action,
            job_id=getattr(result, "id", job_id) if result is not None else job_id,
            outcome="ok",
            **how,
        )
        return result

    def owned(request: Request, job_id: str, action: str) -> str:
        """`job_id` when the caller may `action` it; else Forbidden (audited by the caller's `audited`)."""
        row = store.get(_checked(job_id))
        if not may_act(request.scope["state"], row.summary.uid, admin_gid):
            raise Forbidden(
                f"job {job_id} belongs to {row.summary.user}; only its owner, root or the daemon's admin group "
                f"may {action} it"
            )
        return job_id

    @app.get("/status")
    async def status(request: Request) -> DaemonStatus:
        policy = daemon.policy
        return DaemonStatus(
            version=__version__,
            pid=os.getpid(),
            uptime_seconds=time.time() - daemon.started,
            jobs=store.counts(),
            slots=len(daemon.supervisor.slots),
            data_dir=str(daemon.data_dir),
            plugins_dir=str(policy.plugins_dir),
            dataset_roots=[str(root) for root in policy.dataset_roots],
            max_upload_bytes=policy.max_upload_bytes,
            caller_uid=peer(request)[0],
        )

    @app.post("/jobs", status_code=201)
    async def submit(request: Request, body: SubmitRequest) -> SubmitResponse:
        uid, _pid = peer(request)
        owner = (
            (uid, user_name(uid))
            if uid is not None
            else (TCP_UID, f"token@{request.scope['state'].get('remote', '?').rsplit(':', 1)[0]}")
        )

        def run() -> SubmitResponse:
            accepted = daemon.check(body)
            if body.dry_run:
                accepted.discard()
                return SubmitResponse(job=None, plan=accepted.plan.to_dict(), dry_run=True)
            job = daemon.supervisor.submit(accepted, uid=owner[0], user=owner[1])
            return SubmitResponse(job=job, plan=accepted.plan.to_dict())

        # Validation loads the dataset and plans the job: keep it off the event loop.
        response = await asyncio.to_thread(
            audited, request, "dry_run" if body.dry_run else "submit", None, lambda: run()
        )
        if body.dry_run:
            return JSONResponse(response.model_dump(), status_code=200)
        return response

    @app.get("/jobs")
    async def list_jobs() -> JobList:
        return JobList(jobs=daemon.supervisor.with_phase(store.list()))

    @app.get("/jobs/{job_id}")
    def show(job_id: str) -> JobDetail:
        row = store.get(_checked(job_id))
        job_dir = daemon.job_dir(job_id)
        summary = daemon.supervisor.with_phase([row.summary])[0]
        last = tail_records(job_dir / "metrics.jsonl", 1)
        return JobDetail(
            **summary.model_dump(),
            spec=row.spec,
            plan=row.plan,
            events=store.events(0, job_id, kinds=("state",)),
            last_record=last[-1] if last else None,
            checkpoints=_checkpoints(job_dir),
            best=_json_file(job_dir / "best" / "best.json"),
            job_dir=str(job_dir),
        )

    @app.post("/jobs/{job_id}/pause")
    async def pause(request: Request, job_id: str) -> JobSummary:
        return await asyncio.to_thread(
            audited, request, "pause", job_id, lambda: daemon.supervisor.pause(owned(request, job_id, "pause"))
        )

    @app.post("/jobs/{job_id}/resume")
    async def resume(request: Request, job_id: str) -> JobSummary:
        return await asyncio.to_thread(
            audited, request, "resume", job_id, lambda: daemon.supervisor.resume(owned(request, job_id, "resume"))
        )

    @app.post("/jobs/{job_id}/cancel")
    async def cancel(request: Request, job_id: str) -> JobSummary:
        return await asyncio.to_thread(
            audited, request, "cancel", job_id, lambda: daemon.supervisor.cancel(owned(request, job_id, "cancel"))
        )

    @app.post("/jobs/{job_id}/export", status_code=201)
    async def export(request: Request, job_id: str, body: ExportRequest) -> ExportResponse:
        def run() -> ExportResponse:
            owned(request, job_id, "export")
            result = daemon.exports.run(  # in its own process, one at a time
                job_id,
                daemon.job_dir(job_id),
                daemon.data_dir,
                exports_dir(daemon.data_dir) / body.name,
                body.checkpoint,
                body.merged,
                body.dtype,
            )
            return ExportResponse(
                path=str(result.path), kind=result.kind, job_id=job_id, step=result.step, manifest=result.manifest
            )

        # A merged export loads and writes a whole model: keep it off the event loop.
        return await asyncio.to_thread(audited, request, "export", job_id, run)

    # Plain `def` routes: FastAPI runs them in its thread pool, so a file read never blocks the event loop.
    @app.get("/jobs/{job_id}/metrics")
    def metrics(job_id: str, after_step: int = 0, limit: int = 1000) -> MetricsPage:
        store.get(_checked(job_id))
        limit = max(1, min(limit, 10000))
        rows = records_after_step(daemon.job_dir(job_id) / "metrics.jsonl", after_step, limit)
        page = rows[:limit]
        return MetricsPage(job_id=job_id, records=page, next_after_step=page[-1]["step"] if len(rows) > limit else None)

    @app.get("/jobs/{job_id}/samples")
    def samples(job_id: str, limit: int = 100) -> RecordsPage:
        store.get(_checked(job_id))
        limit = max(1, min(limit, MAX_RECORDS))
        return RecordsPage(job_id=job_id, records=tail_records(daemon.job_dir(job_id) / "samples.jsonl", limit))

    @app.get("/jobs/{job_id}/judge")
    def judge(job_id: str, outcome: str | None = None, limit: int = 100) -> RecordsPage:
        store.get(_checked(job_id))
        keep = (lambda row: row.get("outcome") == outcome) if outcome else None
        rows = tail_records(
            daemon.job_dir(job_id) / "judge.jsonl",
            max(1, min(limit, MAX_RECORDS)),
            keep,
            contains=json.dumps(outcome).encode() if outcome else b"",
        )
        return RecordsPage(job_id=job_id, records=rows)

    @app.get("/jobs/{job_id}/log")
    def log(job_id: str, offset: int = -16384, max_bytes: int = 1 << 20) -> LogChunk:
        store.get(_checked(job_id))
        return _read_log(job_id, daemon.job_dir(job_id) / "log.txt", offset, max(1, min(max_bytes, 8 << 20)))

    @app.get("/events")
    async def events(after: int = 0, job: str | None = None, timeout: float = 0.0) -> EventsPage:
        if job is not None:
            _checked(job)
        deadline = time.monotonic() + max(0.0, min(timeout, MAX_LONG_POLL_SECONDS))
        while True:
            newest = store.last_event_id()
            found = store.events(after, job, limit=1000)
            if found or time.monotonic() >= deadline:
                cursor = found[-1].id if len(found) == 1000 else max([newest, after] + [e.id for e in found])
                return EventsPage(events=found, cursor=cursor)
            await bus.wait(deadline - time.monotonic())

    @app.get("/jobs/{job_id}/endpoint")
    async def endpoint(request: Request, job_id: str) -> EndpointInfo:
        from appliance.service.external import job_endpoint

        # Audited: the answer holds the job's token (the audit line does not).
        return await asyncio.to_thread(
            audited,
            request,
            "endpoint",
            job_id,
            lambda: job_endpoint(daemon, owned(request, job_id, "take the endpoint of")),
        )

    @app.post("/jobs/{job_id}/trajectories")
    async def trajectories(request: Request, job_id: str, body: TrajectorySubmission) -> TrajectoriesAccepted:
        from appliance.service.external import forward_trajectories

        return await asyncio.to_thread(
            audited,
            request,
            "submit_trajectories",
            job_id,
            lambda: forward_trajectories(daemon, owned(request, job_id, "submit trajectories to"), body.groups),
        )

    @app.get("/device")
    async def device() -> DeviceStatus:
        return daemon.supervisor.device_status()

    @app.get("/models")
    async def models() -> ModelList:
        return await asyncio.to_thread(_models, daemon.data_dir)

    return app


def _checked(job_id: str) -> str:
    if not JOB_ID_PATTERN.match(job_id):
        raise BadJobId(f"'{job_id}' is not a job id (ten lowercase hex digits, as 'appliance jobs list' shows)")
    return job_id


def _json_file(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _checkpoints(job_dir: Path) -> list[CheckpointInfo]:
    root = job_dir / "checkpoints"
    found = []
    if root.is_dir():
        for folder in sorted(root.iterdir()):
            match = CHECKPOINT_DIR.match(folder.name)
            if match and (folder / "state.json").is_file():  # state.json is written last: complete
                found.append(CheckpointInfo(step=int(match[1]), path=str(folder)))
    return found


def _read_log(job_id: str, path: Path, offset: int, max_bytes: int) -> LogChunk:
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            handle.seek(start)
            data = handle.read(max_bytes)
    except FileNotFoundError:
        return LogChunk(job_id=job_id, text="", offset=0, next_offset=0, size=0)
    text, consumed = _complete_utf8(data)
    return LogChunk(
        job_id=job_id, text=text, offset=start, next_offset=start + consumed, size=max(size, start + len(data))
    )


def _complete_utf8(data: bytes) -> tuple[str, int]:
    """The text of `data` and the bytes it used: a character cut at the end waits for the next read."""
    for cut in range(0, 4):
        try:
            return data[: len(data) - cut].decode("utf-8"), len(data) - cut
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace"), len(data)


def _models(data_dir: Path) -> ModelList:
    from appliance.models.store import ModelStore, ModelStoreError

    store = ModelStore(data_dir)
    models = []
    for name in store.names():
        try:
            model = store.get(name)
            models.append(
                ModelInfo(
                    name=name,
                    path=str(model.path),
                    architecture=model.architecture,
                    parameters=model.parameters,
                    size_bytes=model.size_bytes,
                )
            )
        except (ModelStoreError, OSError, ValueError):
            models.append(ModelInfo(name=name, path=str(store.path_of(name))))
    return ModelList(models=models)
