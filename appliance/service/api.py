"""The control API's request and response types: what crosses the daemon's Unix socket, as JSON.

pydantic + the standard library only (no torch, no engines): the `appliance
jobs` client and the TUI import this module. A step's record travels as the
plain dict `StepRecord.to_dict()` writes to metrics.jsonl (`StepRecord.from_dict`
gives the typed form); run events carry the `RunEvent.data` dict of their kind.
The routes, each with its response type, are in service/routes.py; errors are
an ErrorResponse (`error` one sentence, `errors` every job-file problem as
`appliance config check` prints them, `plan` when the job does not fit).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Re-exported: the one string rule, and the escaping every client applies to what the daemon sends.
from appliance.text_rules import Line, escaped as escaped

# Re-exported: a metrics page's records in their typed form (what the TUI imports).
from appliance.grpo.step_record import PHASES as PHASES
from appliance.grpo.step_record import StepRecord as StepRecord

API_VERSION = 1
DEFAULT_SOCKET = "/run/appliance/control.sock"

JobState = Literal["queued", "running", "paused", "interrupted", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[str, ...] = ("queued", "running", "paused", "interrupted", "succeeded", "failed", "cancelled")
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
# Ten lowercase hex digits (secrets.token_hex(5)): short to type, no path separators.
JOB_ID_PATTERN = re.compile(r"[0-9a-f]{10}")  # whole ids only: used with fullmatch

# Kinds of JobEvent: "state" {"from", "to", "reason"}; "step" (a StepRecord dict);
# "phase", "checkpoint", "eval", "log", "memory" (the RunEvent data of that kind).
EVENT_KINDS: tuple[str, ...] = ("state", "step", "phase", "checkpoint", "eval", "log", "memory")


# A JSON object as the daemon serves it: a samples or judge-log line, a memory plan.
JsonObject = dict[str, Any]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SubmitRequest(BaseModel):
    """A job file as text, plus the dataset files it names that the daemon may not read itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file_name: Line(4096) = Field(
        description="the job file's name as the user gave it (errors are reported against it)"
    )
    yaml: str = Field(description="the job file's text (at most 256 KiB; config/limits.py)")
    # task.dataset as written in the job file -> the file's text (JSON Lines).
    uploads: dict[Line(1024, min_length=1), str] = Field(default_factory=dict, max_length=1)
    dry_run: bool = False


class ConfigErrorItem(_Wire):
    file: str
    line: int | None = None
    key: str
    message: str
    text: str = Field(description="the error exactly as `appliance config check` prints it")


class ErrorResponse(_Wire):
    error: str
    errors: list[ConfigErrorItem] = Field(default_factory=list)
    plan: dict[str, Any] | None = None


class JobSummary(_Wire):
    id: str
    name: str
    state: JobState
    reason: str = ""
    uid: int
    user: str
    created: float
    updated: float
    step: int = 0
    steps_total: int = 0
    slot: int | None = None
    attempts: int = 0
    phase: str | None = None


class JobList(_Wire):
    jobs: list[JobSummary]


class JobDeleted(_Wire):
    job_id: str
    freed_bytes: int = Field(description="bytes its folder held on disk")


class JobEvent(_Wire):
    id: int = Field(description="cursor: strictly increasing over the whole daemon")
    job_id: str
    time: float
    kind: str
    step: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class CheckpointInfo(_Wire):
    step: int
    path: str


class JobDetail(JobSummary):
    spec: dict[str, Any]
    plan: dict[str, Any] | None = None
    events: list[JobEvent] = Field(default_factory=list, description="state transitions, oldest first")
    last_record: dict[str, Any] | None = None
    checkpoints: list[CheckpointInfo] = Field(default_factory=list)
    best: dict[str, Any] | None = None
    job_dir: str


class SubmitResponse(_Wire):
    job: JobSummary | None = Field(default=None, description="None for a dry run")
    plan: dict[str, Any]
    dry_run: bool = False


class ExportRequest(BaseModel):
    """Export a job's adapter (or a merged model) into <data-dir>/exports/<name>/ on the daemon's box."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A folder name, not a path: the daemon writes only under its own exports folder.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    checkpoint: str = Field(default="best", pattern=r"^(best|latest|step-\d+)$")
    merged: bool = False
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"


class ExportResponse(_Wire):
    path: str
    kind: str  # "adapter" | "merged"
    job_id: str
    step: int
    manifest: dict[str, Any]


class ExportCancelResponse(_Wire):
    job_id: str
    cancelled: bool  # False: the job had no export running or waiting


class MetricsPage(_Wire):
    job_id: str
    records: list[dict[str, Any]]
    next_after_step: int | None = Field(
        default=None, description="pass as after_step for the next page; None at the end"
    )


class RecordsPage(_Wire):
    job_id: str
    records: list[dict[str, Any]]


class LogChunk(_Wire):
    job_id: str
    text: str
    offset: int
    next_offset: int
    size: int


class EventsPage(_Wire):
    events: list[JobEvent]
    cursor: int = Field(description="pass as `after` to get the events that follow")


class SlotStatus(_Wire):
    index: int
    kind: str
    name: str = ""
    total_bytes: int = 0
    used_bytes: int = 0
    job_id: str | None = None
    phase: str | None = None
    budget_bytes: int | None = None
    planned_bytes: dict[str, int] = Field(default_factory=dict)
    measured_bytes: dict[str, int] = Field(default_factory=dict)


class DeviceStatus(_Wire):
    slots: list[SlotStatus]
    disk_free_bytes: int


class ModelInfo(_Wire):
    name: str
    path: str
    architecture: str = ""
    parameters: int = 0
    size_bytes: int = 0


class ModelList(_Wire):
    models: list[ModelInfo]


class DaemonStatus(_Wire):
    version: str
    api_version: int = API_VERSION
    pid: int
    uptime_seconds: float
    jobs: dict[str, int]
    slots: int
    data_dir: str
    plugins_dir: str
    dataset_roots: list[str]
    max_upload_bytes: int
    caller_uid: int | None = None


class EndpointInfo(_Wire):
    """Where a running external-rollout job serves its student (OpenAI-compatible), and the bearer token it wants."""

    job_id: str
    url: str = Field(description="base URL for an OpenAI client, ending in /v1 (loopback on the daemon's box)")
    token: str = Field(description="the job's bearer token (the OpenAI client's api_key); valid while the job runs")
    model: str = Field(description="the model name to send in requests")
    step: int = Field(description="training steps done: the adapter served is the one after this step")


class TrajectorySubmission(BaseModel):
    """Trajectory groups played against the job's endpoint, rewards set (appliance.agents.trajectory's shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: list[dict[str, Any]] = Field(min_length=1)


class TrajectoriesAccepted(_Wire):
    job_id: str
    accepted: int = Field(description="groups accepted by this call; they train in the job's next steps")
    queued: int = Field(description="accepted groups waiting for a step, this call's included")
    step: int
    unserved_messages_dropped: int = Field(
        default=0,
        description="messages after a trajectory's last served turn, left out (never trained, read by no reward)",
    )
