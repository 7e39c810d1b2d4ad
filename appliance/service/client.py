"""The control API's client: httpx over the daemon's Unix socket (or its optional TCP control port with a
bearer token), answers as `api` types.

Used by `appliance jobs` and the TUI; imports nothing heavy. Every failure is
a ClientError carrying the daemon's one-sentence error, the job-file errors
and the plan (409) where there are any; DaemonUnreachable when no daemon
answers on the socket.
"""

from __future__ import annotations

import os
from urllib.parse import quote
from pathlib import Path
from typing import Any, Iterator

import httpx
import yaml

from pydantic import BaseModel, ValidationError

from appliance.errors import ApplianceError
from appliance.service.api import (
    DEFAULT_SOCKET,
    JOB_ID_PATTERN,
    DaemonStatus,
    DeviceStatus,
    ErrorResponse,
    EventsPage,
    ExportCancelResponse,
    ExportRequest,
    ExportResponse,
    JobDeleted,
    JobDetail,
    JobSummary,
    LogChunk,
    MetricsPage,
    ModelList,
    RecordsPage,
    SubmitRequest,
    SubmitResponse,
    EndpointInfo,
    TrajectoriesAccepted,
    TrajectorySubmission,
    escaped,
)

BUILTIN_PREFIX = "builtin:"


def default_socket() -> str:
    """$APPLIANCE_SOCKET, else /run/appliance/control.sock."""
    return os.environ.get("APPLIANCE_SOCKET") or DEFAULT_SOCKET


def tcp_base_url(control_addr: str) -> str:
    """'HOST:PORT' (or '[::1]:PORT') of a daemon's --control-addr -> its base URL; a clear error otherwise."""
    host, sep, port = control_addr.rpartition(":")  # the last colon: an IPv6 host has colons of its own
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ClientError(f"--control-addr '{control_addr}' is not HOST:PORT (for example 10.0.0.5:9470)")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


class ClientError(ApplianceError):
    """The daemon refused a request (or could not be reached); str() is one sentence."""

    def __init__(self, message: str, status: int | None = None, response: ErrorResponse | None = None):
        super().__init__(message)
        self.status = status
        self.response = response

    @property
    def errors(self) -> list[str]:
        return [item.text for item in self.response.errors] if self.response else []

    @property
    def plan(self) -> dict | None:
        return self.response.plan if self.response else None


class DaemonUnreachable(ClientError):
    """No daemon answers on the socket (not running, wrong path, or no permission)."""


class Client:
    """One connection pool to the daemon; use as a context manager or call close().

    By default over the Unix socket; with `control_addr` ('HOST:PORT') and `token` over the daemon's TCP
    control port instead (`appliance serve --control-addr ... --control-token-file ...`)."""

    def __init__(
        self,
        socket_path: str | Path | None = None,
        timeout: float = 30.0,
        control_addr: str | None = None,
        token: str | None = None,
    ):
        if control_addr:
            if not token:
                raise ClientError(
                    "--control-addr needs the daemon's token: pass --token-file FILE (or set APPLIANCE_TOKEN_FILE)"
                )
            self.unreadable_jobs = 0
            self.socket_path = control_addr
            self._where = f"TCP {control_addr}"
            self._hint = "check the address and that the daemon was started with --control-addr"
            self._http = httpx.Client(
                base_url=tcp_base_url(control_addr), timeout=timeout, headers={"Authorization": f"Bearer {token}"}
            )
            return
        self.unreadable_jobs = 0
        self.socket_path = str(socket_path or default_socket())
        self._where = self.socket_path
        self._hint = "start it with 'appliance serve', or pass --socket PATH (or set APPLIANCE_SOCKET)"
        self._http = httpx.Client(
            # The host is a placeholder: the transport connects to the socket whatever the URL names.
            transport=httpx.HTTPTransport(uds=self.socket_path),
            base_url="http://appliance",
            timeout=timeout,
        )

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ----- transport ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, timeout: float | None = None, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, timeout=timeout or self._http.timeout, **kwargs)
        except (httpx.ConnectError, FileNotFoundError, PermissionError, ConnectionRefusedError) as error:
            raise DaemonUnreachable(
                f"no appliance daemon answers on {self._where} ({_reason(error)}); {self._hint}"
            ) from error
        except httpx.TimeoutException as error:
            raise ClientError(f"the daemon on {self._where} did not answer in time") from error
        except httpx.TransportError as error:
            raise DaemonUnreachable(f"the connection to the daemon on {self._where} failed: {error}") from error
        if response.status_code >= 400:
            try:
                body = ErrorResponse.model_validate(response.json())
            except ValueError:  # not our error shape (a proxy's page, a crash): its text is the message
                body = ErrorResponse(error=response.text.strip() or f"HTTP {response.status_code}")
            raise ClientError(body.error, response.status_code, body)
        return response.json()

    # ----- calls -------------------------------------------------------------------------------

    def status(self) -> DaemonStatus:
        return DaemonStatus.model_validate(self._request("GET", "/status"))

    def submit_text(
        self, file_name: str, text: str, uploads: dict[str, str] | None = None, dry_run: bool = False
    ) -> SubmitResponse:
        request = SubmitRequest(file_name=file_name, yaml=text, uploads=uploads or {}, dry_run=dry_run)
        return SubmitResponse.model_validate(self._request("POST", "/jobs", json=request.model_dump()))

    def submit(self, path: str | Path, dry_run: bool = False) -> SubmitResponse:
        """Submit a job file; its dataset file is uploaded unless it lies in a root the daemon reads itself."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ClientError(f"cannot read the job file {path}: {_reason(error)}") from error
        uploads = {}
        dataset = _dataset_reference(text)
        if dataset is not None:
            # Resolved as the job file's own folder would: a relative dataset sits beside the job file.
            local = (path.absolute().parent / Path(dataset).expanduser()).resolve()
            roots = [Path(root) for root in self.status().dataset_roots]
            # A file the daemon can read in place is named, not sent; any other readable file is uploaded.
            if local.is_file() and not any(local.is_relative_to(root) for root in roots):
                try:
                    uploads[dataset] = local.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as error:
                    raise ClientError(f"cannot read the dataset file {local} to upload it: {_reason(error)}") from error
        return self.submit_text(str(path), text, uploads, dry_run)

    def jobs(self) -> list[JobSummary]:
        """Every job the daemon lists; a row this client cannot read is left out (and counted in
        `unreadable_jobs`), so one bad job never empties the list."""
        rows = self._request("GET", "/jobs").get("jobs")
        found = []
        for row in rows if isinstance(rows, list) else []:
            try:
                found.append(JobSummary.model_validate(row))
            except ValidationError:
                continue
        self.unreadable_jobs = (len(rows) if isinstance(rows, list) else 0) - len(found)
        return found

    def job(self, job_id: str) -> JobDetail:
        return JobDetail.model_validate(self._request("GET", f"/jobs/{_segment(job_id)}"))

    def pause(self, job_id: str) -> JobSummary:
        return JobSummary.model_validate(self._request("POST", f"/jobs/{_segment(job_id)}/pause"))

    def resume(self, job_id: str) -> JobSummary:
        return JobSummary.model_validate(self._request("POST", f"/jobs/{_segment(job_id)}/resume"))

    def cancel(self, job_id: str) -> JobSummary:
        return JobSummary.model_validate(self._request("POST", f"/jobs/{_segment(job_id)}/cancel"))

    def delete(self, job_id: str) -> JobDeleted:
        """Remove a finished job (its record, folder and upload); the job's owner, root or an admin."""
        return JobDeleted.model_validate(self._request("DELETE", f"/jobs/{_segment(job_id)}"))

    def metrics(self, job_id: str, after_step: int = 0, limit: int = 1000) -> MetricsPage:
        return MetricsPage.model_validate(
            self._request("GET", f"/jobs/{_segment(job_id)}/metrics", params={"after_step": after_step, "limit": limit})
        )

    def all_metrics(self, job_id: str) -> list[dict]:
        records, after = [], 0
        while after is not None:
            page = self.metrics(job_id, after_step=after)
            records += page.records
            after = page.next_after_step
        return records

    def samples(self, job_id: str, limit: int = 100) -> RecordsPage:
        return RecordsPage.model_validate(
            self._request("GET", f"/jobs/{_segment(job_id)}/samples", params={"limit": limit})
        )

    def judge_log(self, job_id: str, outcome: str | None = None, limit: int = 100) -> RecordsPage:
        params: dict = {"limit": limit}
        if outcome:
            params["outcome"] = outcome
        return RecordsPage.model_validate(self._request("GET", f"/jobs/{_segment(job_id)}/judge", params=params))

    def log(self, job_id: str, offset: int = -16384, max_bytes: int = 1 << 20) -> LogChunk:
        return LogChunk.model_validate(
            self._request("GET", f"/jobs/{_segment(job_id)}/log", params={"offset": offset, "max_bytes": max_bytes})
        )

    def events(self, after: int = 0, job_id: str | None = None, timeout: float = 0.0) -> EventsPage:
        params: dict = {"after": after, "timeout": timeout}
        if job_id:
            params["job"] = job_id
        # The HTTP timeout outlasts the long poll itself, so a quiet poll ends with an answer, not an error.
        return EventsPage.model_validate(self._request("GET", "/events", params=params, timeout=timeout + 10.0))

    def follow_log(self, job_id: str, poll_seconds: float = 1.0, start: int = 0) -> Iterator[str]:
        """Log text as it is written, until the job reaches a final state and its log is read to the end."""
        offset, cursor = start, 0
        while True:
            chunk = self.log(job_id, offset=offset)
            if chunk.text:
                yield chunk.text
            offset = chunk.next_offset
            if chunk.next_offset < chunk.size:  # more is already written: read on before asking about the job
                continue
            job = self.job(job_id)
            if job.state in ("succeeded", "failed", "cancelled", "paused", "interrupted"):
                final = self.log(job_id, offset=offset)
                if final.text:
                    yield final.text
                return
            # Wait for anything to happen to this job (a step, a log line, a state change).
            cursor = self.events(after=cursor, job_id=job_id, timeout=poll_seconds).cursor

    def export(
        self,
        job_id: str,
        name: str,
        checkpoint: str = "best",
        merged: bool = False,
        dtype: str = "bfloat16",
        timeout: float = 3600.0,
    ) -> ExportResponse:
        """Export a job into <data-dir>/exports/<name>/ on the daemon's box (a merged export can take minutes)."""
        body = ExportRequest(name=name, checkpoint=checkpoint, merged=merged, dtype=dtype)
        return ExportResponse.model_validate(
            self._request("POST", f"/jobs/{_segment(job_id)}/export", json=body.model_dump(), timeout=timeout)
        )

    def cancel_export(self, job_id: str) -> ExportCancelResponse:
        """End the job's running export, or drop its waiting one (`cancelled` is False when it has none)."""
        return ExportCancelResponse.model_validate(self._request("DELETE", f"/jobs/{_segment(job_id)}/export"))

    def device(self) -> DeviceStatus:
        return DeviceStatus.model_validate(self._request("GET", "/device"))

    def models(self) -> ModelList:
        return ModelList.model_validate(self._request("GET", "/models"))

    def endpoint(self, job_id: str) -> EndpointInfo:
        """The student endpoint of a running external-rollout job: base URL, bearer token, model name, step."""
        return EndpointInfo.model_validate(self._request("GET", f"/jobs/{_segment(job_id)}/endpoint"))

    def submit_trajectories(self, job_id: str, groups: list[Any]) -> TrajectoriesAccepted:
        """Submit trajectory groups (TrajectoryGroup objects or their dicts) played against the job's endpoint."""
        plain = [group.model_dump(mode="json") if hasattr(group, "model_dump") else group for group in groups]
        request = TrajectorySubmission(groups=plain)
        return TrajectoriesAccepted.model_validate(
            self._request("POST", f"/jobs/{_segment(job_id)}/trajectories", json=request.model_dump(), timeout=330.0)
        )


class EscapedClient:
    """A Client whose every answer (and error message) has its text escaped for a terminal: what a screen shows
    of the daemon's text can never steer the terminal (title, clipboard, screen), whatever the daemon sends.
    The TUI talks through one; its `.client` is the plain Client underneath."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            try:
                return escaped_tree(attribute(*args, **kwargs))
            except ClientError as error:
                raise escaped_error(error) from error

        return call


def escaped_tree(value: Any) -> Any:
    """`value` with every string in it (keys included, models walked) escaped for a terminal."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, BaseModel):
        return type(value).model_validate(escaped_tree(value.model_dump()))
    if isinstance(value, dict):
        return {escaped_tree(key): escaped_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(escaped_tree(item) for item in value)
    return value


def escaped_error(error: ClientError) -> ClientError:
    response = escaped_tree(error.response) if error.response is not None else None
    return type(error)(escaped(str(error)), error.status, response)


def _dataset_reference(text: str) -> str | None:
    """task.dataset of a job file when it names a file (the daemon reports every other problem)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    task = data.get("task") if isinstance(data, dict) else None
    dataset = task.get("dataset") if isinstance(task, dict) else None
    if isinstance(dataset, str) and dataset and not dataset.startswith(BUILTIN_PREFIX):
        return dataset
    return None


def _segment(job_id: str) -> str:
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise ClientError(
            f"'{job_id}' is not a job id (ten lowercase hex digits, as 'appliance jobs list' shows)", status=400
        )
    return quote(job_id, safe="")  # checked above; quoted anyway, so no id can reach another route


def _reason(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    cause = error.__cause__ or error.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(error) or type(error).__name__
