"""The control API's routes (FastAPI), each short; one handler maps the project's errors to HTTP.

The caller's uid and pid come from SO_PEERCRED (server.py puts them in the
connection's ASGI state); a request without them is refused before routing,
except on the optional TCP control port, where it must carry the daemon's
bearer token instead (compared in constant time; a refusal is a 401, audited).
Every mutating call is written to the audit log with its outcome, refusals
included (rate-limited per caller: audit.py's chatter). Files of a job
(metrics, samples, judge log, log.txt) are read from its job folder, which the
worker writes; the job store holds states and events. Every body is bounded
before it is read (a submission's and a trajectory upload's by their own
limits, any other by SMALL_BODY_BYTES), and every answer is ASCII JSON: text
the daemon holds (old data included) is escaped, never a reason to fail.
"""

from __future__ import annotations

import asyncio
import errno
import json
import secrets
import sys
import traceback
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from appliance import __version__
from appliance.errors import ApplianceError
from appliance.http_listener import network_of
from appliance.service.api import ErrorResponse
from appliance.service.routes import daemon_router, jobs_router
from appliance.service.submission import SubmissionRejected

if TYPE_CHECKING:
    from appliance.service.daemon import Daemon

# A write the file system refused: 507 Insufficient Storage, with what to free; reads go on.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


SMALL_BODY_BYTES = 64 * 1024  # any body other than a submission's or a trajectory upload's


class Unauthenticated(ApplianceError):
    http_status = 403


class ASCIIJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate in stored text is sent as \\udXXX rather
    than failing the encoder (a 500 for ever, for every caller of that job)."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class EventBus:
    """Wakes long-polls when the store appends an event (notify may come from any thread)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Future] = set()

    def notify(self, _event_id: int = 0) -> None:
        # Called from the supervisor's threads: the futures belong to the event loop, so the wake is handed to it.
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
        if state.get("peer"):  # a Unix-socket caller: the kernel vouches for its uid
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
            response = ASCIIJSONResponse(
                ErrorResponse(
                    error=f"{problem}; send 'Authorization: Bearer <token>' with "
                    "the token of the daemon's --control-token-file"
                ).model_dump(),
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        response = ASCIIJSONResponse(
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
        scheme, _, given = values[-1].partition(b" ")  # the last header, as the ASGI server would read it
        if scheme.lower() != b"bearer" or not given.strip():
            return "no bearer token"
        if not secrets.compare_digest(given.strip(), self.token):
            return "wrong bearer token"
        return None


MAX_AUDIT_PATH = 200  # a request path is the caller's choice: cut before it reaches the audit line


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Pure ASGI middleware: a body over the route's limit (`limit_of(method, path)`) is a 413, from
    Content-Length before anything is read, else as soon as the streamed chunks pass it (never buffered whole)."""

    def __init__(self, app, limit_of) -> None:
        self.app, self.limit_of = app, limit_of

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.max_bytes = max_bytes = self.limit_of(scope["method"], scope["path"])
        declared = [value for name, value in scope.get("headers", []) if name == b"content-length"]
        # A declared length is trusted only to refuse early; the streamed count below holds whatever it says.
        if declared and (not declared[-1].isdigit() or int(declared[-1]) > max_bytes):
            await self._refuse(scope, receive, send)
            return
        seen, started, refused = 0, False, False

        async def limited_receive():
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > max_bytes:
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
        limit = self.limit_of(scope["method"], scope["path"])
        message = f"the request body is over this daemon's limit of {limit} bytes for {scope['method']} requests here"
        await ASCIIJSONResponse(ErrorResponse(error=message).model_dump(), status_code=413)(scope, receive, send)


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
            remote = state.get("remote")
            how = {"transport": "unix"} if state.get("peer") else {"transport": "tcp", "remote": remote}
            caller = ("uid", uid) if state.get("peer") else ("tcp", network_of(remote or "?"))
            where = f"{scope['method']} {scope['path'][:MAX_AUDIT_PATH]}"
            await asyncio.to_thread(
                self.audit.chatter,
                caller,
                uid=uid,
                pid=pid,
                action="request",
                job_id=None,
                outcome=f"refused: {status} ({where})",
                **how,
            )


def status_of(error: ApplianceError) -> int:
    """The HTTP status of a project error: its kind's http_status (ApplianceError's is 400, input to correct)."""
    return error.http_status


async def appliance_error(_request: Request, error: ApplianceError) -> JSONResponse:
    body = ErrorResponse(
        error=str(error).splitlines()[0] if str(error) else type(error).__name__,
        errors=error.items() if isinstance(error, SubmissionRejected) else [],
        plan=error.plan if isinstance(error, SubmissionRejected) else None,
    )
    return ASCIIJSONResponse(body.model_dump(), status_code=status_of(error))


async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    message = (
        f"no API route {request.method} {request.url.path}" if error.status_code in (404, 405) else str(error.detail)
    )
    return ASCIIJSONResponse(ErrorResponse(error=message).model_dump(), status_code=error.status_code)


async def os_error(_request: Request, error: OSError) -> JSONResponse:
    """A file the daemon could not write or read (a path no route turned into a project error)."""
    where = f" {error.filename}" if error.filename else ""
    if error.errno in DISK_ERRNOS:
        message = (
            f"the daemon could not write{where} ({error.strerror}); it keeps serving reads. "
            "Free space on that file system (or fix the I/O error) and retry"
        )
        return ASCIIJSONResponse(ErrorResponse(error=message).model_dump(), status_code=507)
    traceback.print_exception(error, file=sys.stderr)
    message = f"the daemon failed on{where or ' a file'}: {error}; the traceback is in the daemon's log"
    return ASCIIJSONResponse(ErrorResponse(error=message).model_dump(), status_code=500)


async def bad_request(_request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0] if error.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = f"bad request: {where + ': ' if where else ''}{first.get('msg', 'invalid')}"
    return ASCIIJSONResponse(ErrorResponse(error=message).model_dump(), status_code=422)


def body_limits(daemon: "Daemon"):
    """The largest body each route takes: (method, path) -> bytes."""

    def limit_of(method: str, path: str) -> int:
        if method == "POST" and path.rstrip("/") == "/jobs":
            return daemon.submit_body_limit
        if method == "POST" and path.endswith("/trajectories"):
            return daemon.trajectory_body_limit
        return SMALL_BODY_BYTES

    return limit_of


def create_app(daemon: "Daemon", control_token: str | None = None, admin_gid: int | None = None) -> FastAPI:
    app = FastAPI(
        title="appliance control API",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        default_response_class=ASCIIJSONResponse,
        redirect_slashes=False,  # "/jobs/ID/" is no second name of a job: a 404, not a 307 to it
    )
    app.state.daemon, app.state.admin_gid = daemon, admin_gid
    app.add_middleware(BodyLimit, limit_of=body_limits(daemon))
    app.add_middleware(AuditRefusals, audit=daemon.audit)
    app.add_middleware(PeerCredentials, token=control_token, audit=daemon.audit)
    app.add_exception_handler(ApplianceError, appliance_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(OSError, os_error)
    app.include_router(daemon_router)
    app.include_router(jobs_router)
    return app
