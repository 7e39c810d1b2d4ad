"""The control API's routes: module-level routers, with the daemon, the caller and auditing as dependencies.

Reads of job files are plain `def` routes (FastAPI runs them in its thread
pool) over bounded pages; mutating calls go through `Auditor`, which writes
their outcome to the audit log and checks that the caller may act on the job,
on the daemon's own control threads (never behind a submission's check or an
export). The caller's groups were read from the connection (SO_PEERGROUPS)
when it was made. Submissions and trajectory groups are taken as raw bodies:
the daemon streams them on (service/admission.py, the job's endpoint) and
never parses them itself.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Annotated, Any, Callable, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response

from appliance import __version__
from appliance.errors import ApplianceError
from appliance.http_listener import network_of
from appliance.paths import exports_dir
from appliance.service.api import (
    JOB_ID_PATTERN,
    DaemonStatus,
    DeviceStatus,
    EndpointInfo,
    EventsPage,
    ExportCancelResponse,
    ExportRequest,
    ExportResponse,
    JobDeleted,
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
    TrajectoriesAccepted,
    TrajectorySubmission,
)
from appliance.service.audit import user_name
from appliance.service.bounded_reads import checkpoints, json_file, read_log, records_after_step, tail_records
from appliance.service.fair_share import check_quota

if TYPE_CHECKING:
    from appliance.service.daemon import Daemon

MAX_LONG_POLL_SECONDS = 60.0  # a long poll holds a request open: a caller's wait is capped, not trusted
# Query parameters: bounded where they are parsed (a number past SQLite's 64 bits was a 500); pages are then
# clamped to their own limits in the routes.
Number = Annotated[int, Query(ge=-(2**62), le=2**62)]
Cursor = Annotated[int, Query(ge=0, le=2**62)]
Wait = Annotated[float, Query(ge=0.0, le=MAX_LONG_POLL_SECONDS, allow_inf_nan=False)]
JobIdQuery = Annotated[str, Query(max_length=64)]
Outcome = Annotated[str, Query(max_length=64)]
MAX_RECORDS = 1000  # the most records one page of samples or judge calls holds
TCP_UID = -1  # the owner recorded for a job submitted over TCP: a token holder, not a Unix user
T = TypeVar("T")


class BadJobId(ApplianceError):
    http_status = 400


class Forbidden(ApplianceError):
    """The caller may see the job but not act on it."""

    http_status = 403


def may_act(state: dict, owner_uid: int, admin_gid: int | None) -> bool:
    """Owner, root, the admin group, or a TCP token holder (the administrator's token) may act on a job.
    The groups are those the connection carried when it was made (server.py), whatever the peer's pid."""
    credentials = state.get("peer")
    if not credentials:
        return state.get("remote") is not None  # passed PeerCredentials with the daemon's bearer token
    _pid, uid, gid = credentials
    if uid in (0, owner_uid):
        return True
    return admin_gid is not None and admin_gid in {gid, *(state.get("groups") or ())}


def checked(job_id: str) -> str:
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise BadJobId(f"'{job_id}' is not a job id (ten lowercase hex digits, as 'appliance jobs list' shows)")
    return job_id


def get_daemon(request: Request) -> "Daemon":
    return request.app.state.daemon


# Any, not Daemon: daemon.py imports this package at load time, and FastAPI evaluates the annotation.
DaemonDep = Annotated[Any, Depends(get_daemon)]


class Auditor:
    """The caller of one request (SO_PEERCRED uid/pid, or the TCP address) and the audit log's record of its call."""

    def __init__(self, request: Request, daemon: DaemonDep) -> None:
        self.daemon, self.state = daemon, request.scope["state"]
        self.request = request
        credentials = self.state.get("peer")
        self.pid, self.uid = (credentials[0], credentials[1]) if credentials else (None, None)
        self.how = {"transport": "unix"} if credentials else {"transport": "tcp", "remote": self.state.get("remote")}
        remote = self.state.get("remote") or "?"
        # Who a per-caller bound counts: a uid on the socket, a host on the TCP port.
        self.key = ("uid", self.uid) if credentials else ("tcp", network_of(remote))

    def owner(self) -> tuple[int, str]:
        if self.uid is not None:
            return self.uid, user_name(self.uid)
        return TCP_UID, f"token@{(self.state.get('remote') or '?').rsplit(':', 1)[0]}"

    def owned(self, job_id: str, action: str) -> str:
        """`job_id` when the caller may `action` it; else Forbidden."""
        row = self.daemon.store.get(checked(job_id))
        if not may_act(self.state, row.summary.uid, self.request.app.state.admin_gid):
            raise Forbidden(
                f"job {job_id} belongs to {row.summary.user}; only its owner, root or the daemon's admin group "
                f"may {action} it"
            )
        return job_id

    def _record(self, action: str, job_id: str | None, outcome: str) -> None:
        self.daemon.audit.record(uid=self.uid, pid=self.pid, action=action, job_id=job_id, outcome=outcome, **self.how)

    def chatter(self, action: str, job_id: str | None, outcome: str) -> None:
        """A line the caller can repeat at will (a refusal, a dry run, "received"): rate-limited per caller."""
        if not outcome.startswith("received"):
            self.state["audited"] = True  # the answer's own line: AuditRefusals writes no second one
        fields = dict(uid=self.uid, pid=self.pid, action=action, job_id=job_id, outcome=outcome, **self.how)
        self.daemon.audit.chatter(self.key, **fields)

    def call(self, action: str, job_id: str | None, run: Callable[[], T]) -> T:
        """run() with its outcome audited, refusals included (AuditRefusals then skips the 4xx); a change past the
        caller's rate is refused before it runs (call_rate.py), except a submission (bounded by its own turn)."""
        self.state["audited"] = True
        try:
            if action != "submit":
                self.daemon.call_rate.charge(self.key)
            result = run()
        except ApplianceError as error:
            self.chatter(action, job_id, f"refused: {str(error).splitlines()[0] if str(error) else ''}")
            raise
        except Exception as error:
            self._record(action, job_id, f"error: {error}")
            raise
        self._record(action, _job_id_of(result) or job_id, "ok")
        return result

    async def in_thread(self, action: str, job_id: str | None, run: Callable[[], T], pool=None) -> T:
        """call() on the daemon's control threads (or `pool`): never behind submissions or exports."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool or self.daemon.control_pool, self.call, action, job_id, run)

    async def note(self, action: str, job_id: str | None, outcome: str) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self.daemon.control_pool, self.chatter, action, job_id, outcome
        )


def _job_id_of(result: Any) -> str | None:
    """The job an answer is about (a JobSummary, or a SubmitResponse's job), for its audit line."""
    job = getattr(result, "job", None) or result
    return getattr(job, "id", None) or getattr(job, "job_id", None)


AuditorDep = Annotated[Auditor, Depends(Auditor)]
daemon_router = APIRouter()
jobs_router = APIRouter(prefix="/jobs")


@daemon_router.get("/status")
async def status(daemon: DaemonDep, caller: AuditorDep) -> DaemonStatus:
    policy = daemon.policy
    return DaemonStatus(
        version=__version__,
        pid=os.getpid(),
        uptime_seconds=time.time() - daemon.started,
        jobs=daemon.store.counts(),
        slots=len(daemon.supervisor.slots),
        data_dir=str(daemon.data_dir),
        plugins_dir=str(policy.plugins_dir),
        dataset_roots=[str(root) for root in policy.dataset_roots],
        max_upload_bytes=policy.max_upload_bytes,
        caller_uid=caller.uid,
    )


@daemon_router.get("/events")
async def events(
    daemon: DaemonDep, after: Cursor = 0, job: JobIdQuery | None = None, timeout: Wait = 0.0
) -> EventsPage:
    if job is not None:
        checked(job)
    deadline = time.monotonic() + max(0.0, min(timeout, MAX_LONG_POLL_SECONDS))
    while True:
        # Off the event loop: a page of a thousand events is parsed from JSON.
        newest = await asyncio.to_thread(daemon.store.last_event_id)
        found = await asyncio.to_thread(daemon.store.events, after, job, None, 1000)
        if found or time.monotonic() >= deadline:
            # A full page: the caller goes on from its last event. Else the newest id overall, so a filtered
            # poll does not re-scan other jobs' events next time.
            cursor = found[-1].id if len(found) == 1000 else max([newest, after] + [e.id for e in found])
            return EventsPage(events=found, cursor=cursor)
        await daemon.bus.wait(deadline - time.monotonic())


@daemon_router.get("/device")
async def device(daemon: DaemonDep) -> DeviceStatus:
    return daemon.supervisor.device_status()


@daemon_router.get("/models")
def models(daemon: DaemonDep) -> ModelList:
    from appliance.models.store import ModelStore, ModelStoreError

    store = ModelStore(daemon.data_dir)
    found = []
    for name in store.names():
        try:
            model = store.get(name)
            found.append(
                ModelInfo(
                    name=name,
                    path=str(model.path),
                    architecture=model.architecture,
                    parameters=model.parameters,
                    size_bytes=model.size_bytes,
                )
            )
        except (ModelStoreError, OSError, ValueError):
            found.append(ModelInfo(name=name, path=str(store.path_of(name))))
    return ModelList(models=found)


def _raw_body(model) -> dict:
    """The OpenAPI request body of a route that takes its body raw (the schema clients and fuzzers see)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


@jobs_router.post("", status_code=201, response_model=SubmitResponse, openapi_extra=_raw_body(SubmitRequest))
async def submit(request: Request, response: Response, daemon: DaemonDep, caller: AuditorDep) -> SubmitResponse:
    """Check a job file in a child process (service/admission.py), then queue it unless it is a dry run."""
    declared = request.headers.get("content-length", "?")
    await caller.note("submit", None, f"received ({declared} bytes)")  # before any costly work
    uid, user = caller.owner()
    loop = asyncio.get_running_loop()
    try:
        async with daemon.admission.turn(caller.key):
            await loop.run_in_executor(daemon.control_pool, check_quota, daemon, uid, user)
            body = await daemon.admission.spool(request.stream(), daemon.submit_body_limit)
            device = await loop.run_in_executor(daemon.control_pool, daemon.device)
            verdict = daemon.placeable(await daemon.admission.check(body, device))
    except ApplianceError as error:  # busy, over a cap or the body limit: refused before any check
        await caller.note("submit", None, f"refused: {str(error).splitlines()[0]}")
        raise
    action = "dry_run" if verdict.dry_run else "submit"
    if not verdict.accepted:
        await caller.note(action, None, f"refused: {verdict.message}")
        raise verdict.refusal()
    if verdict.dry_run:
        await asyncio.get_running_loop().run_in_executor(daemon.control_pool, verdict.discard)
        await caller.note(action, None, "ok")
        response.status_code = 200  # nothing was created
        return SubmitResponse(job=None, plan=verdict.plan, dry_run=True)

    def run() -> SubmitResponse:
        job = daemon.queue(verdict, uid=uid, user=user)
        return SubmitResponse(job=job, plan=verdict.plan)

    return await caller.in_thread("submit", None, run)


@jobs_router.get("")
def list_jobs(daemon: DaemonDep) -> JobList:  # a plain def: FastAPI's thread pool, off the event loop
    return JobList(jobs=daemon.supervisor.with_phase(daemon.store.list()))


@jobs_router.get("/{job_id}")
def show(job_id: str, daemon: DaemonDep) -> JobDetail:
    row = daemon.store.get(checked(job_id))
    job_dir = daemon.job_dir(job_id)
    summary = daemon.supervisor.with_phase([row.summary])[0]
    last = tail_records(job_dir / "metrics.jsonl", 1)
    return JobDetail(
        **summary.model_dump(),
        spec=row.spec,
        plan=row.plan,
        events=daemon.store.events(0, job_id, kinds=("state",)),
        last_record=last[-1] if last else None,
        checkpoints=checkpoints(job_dir),
        best=json_file(job_dir / "best" / "best.json"),
        job_dir=str(job_dir),
    )


@jobs_router.post("/{job_id}/pause")
async def pause(job_id: str, daemon: DaemonDep, caller: AuditorDep) -> JobSummary:
    return await caller.in_thread("pause", job_id, lambda: daemon.supervisor.pause(caller.owned(job_id, "pause")))


@jobs_router.post("/{job_id}/resume")
async def resume(job_id: str, daemon: DaemonDep, caller: AuditorDep) -> JobSummary:
    return await caller.in_thread("resume", job_id, lambda: daemon.supervisor.resume(caller.owned(job_id, "resume")))


@jobs_router.post("/{job_id}/cancel")
async def cancel(job_id: str, daemon: DaemonDep, caller: AuditorDep) -> JobSummary:
    return await caller.in_thread("cancel", job_id, lambda: daemon.supervisor.cancel(caller.owned(job_id, "cancel")))


@jobs_router.post("/{job_id}/export", status_code=201)
async def export(job_id: str, body: ExportRequest, daemon: DaemonDep, caller: AuditorDep) -> ExportResponse:
    def run() -> ExportResponse:
        caller.owned(job_id, "export")
        result = daemon.exports.run(  # in its own process, one at a time
            job_id,
            daemon.job_dir(job_id),
            daemon.data_dir,
            exports_dir(daemon.data_dir) / body.name,
            body.checkpoint,
            body.merged,
            body.dtype,
            caller.key,
        )
        return ExportResponse(
            path=str(result.path), kind=result.kind, job_id=job_id, step=result.step, manifest=result.manifest
        )

    # The export waits for its slot and its child process: on its own threads, off the event loop.
    return await caller.in_thread("export", job_id, run, pool=daemon.export_pool)


@jobs_router.delete("/{job_id}/export")
async def cancel_export(job_id: str, daemon: DaemonDep, caller: AuditorDep) -> ExportCancelResponse:
    def run() -> ExportCancelResponse:
        cancelled = daemon.exports.cancel(caller.owned(job_id, "cancel the export of"))
        return ExportCancelResponse(job_id=job_id, cancelled=cancelled)

    return await caller.in_thread("cancel_export", job_id, run)


@jobs_router.get("/{job_id}/metrics")
def metrics(job_id: str, daemon: DaemonDep, after_step: Number = 0, limit: Number = 1000) -> MetricsPage:
    daemon.store.get(checked(job_id))  # an unknown job is a 404 before any file is read
    limit = max(1, min(limit, 10000))
    rows = records_after_step(daemon.job_dir(job_id) / "metrics.jsonl", after_step, limit)
    page = rows[:limit]
    return MetricsPage(job_id=job_id, records=page, next_after_step=page[-1]["step"] if len(rows) > limit else None)


@jobs_router.get("/{job_id}/samples")
def samples(job_id: str, daemon: DaemonDep, limit: Number = 100) -> RecordsPage:
    daemon.store.get(checked(job_id))
    limit = max(1, min(limit, MAX_RECORDS))
    return RecordsPage(job_id=job_id, records=tail_records(daemon.job_dir(job_id) / "samples.jsonl", limit))


@jobs_router.get("/{job_id}/judge")
def judge(job_id: str, daemon: DaemonDep, outcome: Outcome | None = None, limit: Number = 100) -> RecordsPage:
    import json

    daemon.store.get(checked(job_id))
    keep: Any = (lambda row: row.get("outcome") == outcome) if outcome else None
    rows = tail_records(
        daemon.job_dir(job_id) / "judge.jsonl",
        max(1, min(limit, MAX_RECORDS)),
        keep,
        # A byte filter before JSON parsing: a scan for rare failures does not parse every ok line.
        contains=json.dumps(outcome).encode() if outcome else b"",
    )
    return RecordsPage(job_id=job_id, records=rows)


# offset: negative counts from the end (the default shows the last lines); a chunk is capped whatever is asked.
@jobs_router.get("/{job_id}/log")
def log(job_id: str, daemon: DaemonDep, offset: Number = -16384, max_bytes: Number = 1 << 20) -> LogChunk:
    daemon.store.get(checked(job_id))
    return read_log(job_id, daemon.job_dir(job_id) / "log.txt", offset, max(1, min(max_bytes, 8 << 20)))


@jobs_router.get("/{job_id}/endpoint")
async def endpoint(job_id: str, daemon: DaemonDep, caller: AuditorDep) -> EndpointInfo:
    from appliance.service.external_forward import job_endpoint

    # Audited: the answer holds the job's token (the audit line does not).
    return await caller.in_thread(
        "endpoint", job_id, lambda: job_endpoint(daemon, caller.owned(job_id, "take the endpoint of"))
    )


@jobs_router.post(
    "/{job_id}/trajectories", response_model=TrajectoriesAccepted, openapi_extra=_raw_body(TrajectorySubmission)
)
async def trajectories(job_id: str, request: Request, daemon: DaemonDep, caller: AuditorDep) -> TrajectoriesAccepted:
    """Forward the groups, as sent, to the job's endpoint, which checks them; one call at a time per caller."""
    from appliance.service.external_forward import forward_trajectories

    async with daemon.forwarding.turn(caller.key):
        body = await daemon.forwarding.read(request.stream(), daemon.trajectory_body_limit)

        def run() -> TrajectoriesAccepted:
            return forward_trajectories(daemon, caller.owned(job_id, "submit trajectories to"), body)

        async with daemon.forwarding.slot():  # taken once the body is in: a slow sender holds no forwarding slot
            return await caller.in_thread("submit_trajectories", job_id, run, pool=daemon.forward_pool)


@jobs_router.delete("/{job_id}")
async def delete(job_id: str, daemon: DaemonDep, caller: AuditorDep) -> JobDeleted:
    """Remove a finished job: its row, events, folder and upload (owner, root or the admin group; audited)."""
    return await caller.in_thread("delete", job_id, lambda: daemon.delete(caller.owned(job_id, "delete")))
