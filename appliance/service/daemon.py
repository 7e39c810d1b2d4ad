"""The daemon's parts in one place: job store, supervisor, audit log, submission policy, event bus, metrics.

server.py runs it (socket, uvicorn, signals, sd_notify); control.py serves it.
Constructing a Daemon takes the data dir's lock, so two daemons never share
one job store.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from appliance import __version__
from appliance.agents.endpoint_bind import LOOPBACK_ANY_PORT, EndpointBind
from appliance.errors import ApplianceError
from appliance.metrics.training_metrics import TrainingMetrics
from appliance.paths import STATE_DIR_MODE, datasets_dir, jobs_dir, own_data_dir, plugins_dir, uploads_dir
from appliance.service.api import SubmitRequest
from appliance.service.audit import AuditLog
from appliance.service.control import EventBus
from appliance.service.exports import ExportRunner
from appliance.service.reaper import become_subreaper
from appliance.service.job_store import JobStore
from appliance.service.slot_assignment import unplaceable
from appliance.service.submission import Accepted, Policy, SubmissionRejected, check_submission
from appliance.service.supervisor import Slot, Supervisor, probe_slots, slot_device

# An uploaded dataset is refused past this unless the operator allows more (an option of appliance serve).
DEFAULT_MAX_UPLOAD_BYTES = 64 * 2**20


class DaemonError(ApplianceError):
    """The daemon cannot start; the message says what to change."""


@dataclass(frozen=True)
class DaemonOptions:
    data_dir: Path
    dataset_roots: tuple[Path, ...] = ()  # default: <data-dir>/datasets
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    secrets_roots: tuple[Path, ...] = ()  # default: <data-dir>/secrets
    judge_endpoints: tuple[str, ...] = ()
    stop_timeout: float = 120.0
    max_restarts: int = 3
    backoff_seconds: tuple[float, ...] = (2.0, 4.0, 8.0)
    slots: list[Slot] | None = field(default=None)  # default: probe_slots()
    # Where external-rollout jobs' student endpoints listen (agents/endpoint_bind.py); default loopback.
    agent_endpoint: EndpointBind = LOOPBACK_ANY_PORT


class Daemon:
    def __init__(self, options: DaemonOptions):
        self.data_dir = own_data_dir(Path(options.data_dir).absolute())  # refused when another user owns it
        for folder in (
            jobs_dir(self.data_dir),
            plugins_dir(self.data_dir),
            datasets_dir(self.data_dir),
            uploads_dir(self.data_dir),
        ):
            folder.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
        self._lock_fd = os.open(self.data_dir / "appliance.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # Non-blocking: a second daemon is refused at once; the kernel drops the lock when this process dies.
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DaemonError(f"another appliance daemon already serves {self.data_dir}; stop it first") from None
        self.started = time.time()
        become_subreaper()  # orphans of killed worker groups come to us (the supervisor's tick reaps them)
        self.policy = Policy(
            data_dir=self.data_dir,
            plugins_dir=plugins_dir(self.data_dir),
            dataset_roots=tuple(Path(root).absolute() for root in options.dataset_roots)
            or (datasets_dir(self.data_dir),),
            uploads_dir=uploads_dir(self.data_dir),
            max_upload_bytes=options.max_upload_bytes,
            secrets_roots=tuple(Path(root).absolute() for root in options.secrets_roots),
            judge_endpoints=options.judge_endpoints,
        )
        self.store = JobStore(self.data_dir / "appliance.db")
        self.audit = AuditLog(self.data_dir / "audit.jsonl")
        self.bus = EventBus()
        self.exports = ExportRunner()
        self.store.listeners.append(self.bus.notify)  # every stored event wakes the long-polls waiting for one
        self.metrics = TrainingMetrics(version=__version__, student_model="", judge_model=None)
        self.metrics.observe_disk(self.data_dir)
        _known_series(self.metrics)
        self.supervisor = Supervisor(
            self.store,
            self.data_dir,
            options.slots or probe_slots(),
            self.metrics,
            max_restarts=options.max_restarts,
            backoff_seconds=options.backoff_seconds,
            stop_timeout=options.stop_timeout,
            version=__version__,
            worker_env=options.agent_endpoint.environment(),
        )

    def job_dir(self, job_id: str) -> Path:
        return self.supervisor.job_dir(job_id)

    def check(self, request: SubmitRequest) -> Accepted:
        """Validate and plan a submission against the first slot's device (all slots are alike)."""
        accepted = check_submission(request, self.policy, slot_device(self.supervisor.slots[0]))
        refusal = unplaceable(accepted.spec.model_dump(mode="json"), len(self.supervisor.slots))
        if refusal:
            accepted.discard()
            raise SubmissionRejected(409, f"job '{accepted.spec.name}' cannot run here: {refusal}")
        return accepted

    def close(self) -> None:
        self.store.close()
        self.audit.close()
        os.close(self._lock_fd)


def _known_series(metrics: TrainingMetrics) -> None:
    """Every label value the design names, at 0 from the start: a series that appears only after its
    first event breaks rate() and hides "no judge requests yet" from dashboards."""
    from appliance.grpo.step_record import JUDGE_OUTCOMES, ROLES

    for outcome in JUDGE_OUTCOMES:
        metrics.judge_requests.labels(outcome=outcome)
    for role in ROLES:
        metrics.generated_tokens.labels(role=role)
        metrics.prompt_tokens.labels(role=role)
