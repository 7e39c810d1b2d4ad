"""The daemon's parts in one place: job store, supervisor, audit log, submission policy, event bus, metrics.

server.py runs it (socket, uvicorn, signals, sd_notify); control.py serves it.
Constructing a Daemon takes the data dir's lock, so two daemons never share
one job store. Its threads: a few for control calls (pause, resume, cancel,
delete), their own for exports and forwarded trajectories, the admission's for
submissions (service/admission.py), and one housekeeping thread (stored bytes
per user, retention of finished jobs, uploads of ended jobs: fair_share.py).
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from appliance import __version__
from appliance.agents.endpoint_bind import LOOPBACK_ANY_PORT, EndpointBind
from appliance.errors import ApplianceError
from appliance.metrics.training_metrics import TrainingMetrics
from appliance.paths import STATE_DIR_MODE, datasets_dir, jobs_dir, own_data_dir, plugins_dir, uploads_dir
from appliance.config.limits import DEFAULT_MAX_UPLOAD_BYTES
from appliance.service import fair_share
from appliance.service.admission import Admission, Turns, Verdict
from appliance.service.api import TERMINAL_STATES, JobDeleted, JobSummary
from appliance.service.audit import AuditLog
from appliance.service.call_rate import CallRate
from appliance.service.control import EventBus
from appliance.service.exports import ExportRunner
from appliance.service.job_store import JobStore
from appliance.service.reaper import become_subreaper
from appliance.service.slot_assignment import unplaceable
from appliance.service.submission import Accepted, Policy
from appliance.service.supervisor import Slot, Supervisor, probe_slots, slot_device

CONTROL_THREADS = 4  # pause, resume, cancel, delete, endpoint, audit lines
EXPORT_THREADS = 3  # one export runs, two may wait (service/exports.py)
FORWARD_THREADS = 4  # trajectory groups forwarded to jobs' endpoints at once
MAX_TRAJECTORY_BODY_BYTES = 16 * 2**20


class DaemonError(ApplianceError):
    """The daemon cannot start; the message says what to change."""


@dataclass(frozen=True)
class DaemonOptions:
    data_dir: Path
    dataset_roots: tuple[Path, ...] = ()  # default: <data-dir>/datasets
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    secrets_roots: tuple[Path, ...] = ()  # default: <data-dir>/secrets
    judge_endpoints: tuple[str, ...] = ()
    model_roots: tuple[Path, ...] = ()  # folders a job's model path may name, besides the model store
    quotas: fair_share.Quotas = fair_share.Quotas()
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
            model_roots=tuple(Path(os.path.normpath(Path(root).absolute())) for root in options.model_roots),
        )
        self.quotas, self.usage = options.quotas, fair_share.Usage()
        # The whole body of a submission: the job file and an upload, JSON-escaped (at most twice as long).
        self.submit_body_limit = 2 * options.max_upload_bytes + (1 << 20)
        self.trajectory_body_limit = MAX_TRAJECTORY_BODY_BYTES
        self._start_pools()
        self.store = JobStore(self.data_dir / "appliance.db")
        self.store.on_final.append(self._job_ended)
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
            worker_env={
                **options.agent_endpoint.environment(),
                "APPLIANCE_EXTERNAL_IDLE_SECONDS": str(options.quotas.external_idle_seconds),
            },
            max_running_per_user=options.quotas.max_running,
            slot_seconds=options.quotas.slot_seconds,
        )

    def _start_pools(self) -> None:
        """The admission's checks, and the daemon's own threads for control calls, exports and forwarding."""
        self.admission = Admission(self.policy, uploads_dir(self.data_dir))
        # Trajectory bodies are held in memory until forwarded: fewer may arrive at once than submissions.
        self.forwarding = Turns(FORWARD_THREADS, "trajectory submission", arriving=2 * FORWARD_THREADS)
        self.call_rate = CallRate()
        self.control_pool = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="control")
        self.export_pool = ThreadPoolExecutor(EXPORT_THREADS, thread_name_prefix="export")
        self.forward_pool = ThreadPoolExecutor(FORWARD_THREADS, thread_name_prefix="forward")
        self._housekeeping_stop = threading.Event()
        self._queueing = threading.Lock()  # one submission stored at a time: its caps checked with its insert

    def job_dir(self, job_id: str) -> Path:
        return self.supervisor.job_dir(job_id)

    def device(self):
        """The device submissions are planned against: the first slot's (all slots are alike)."""
        return slot_device(self.supervisor.slots[0])

    def placeable(self, verdict: Verdict) -> Verdict:
        """The verdict, or a 409 refusal when this daemon can never run the job (its upload removed)."""
        refusal = unplaceable(verdict.spec, len(self.supervisor.slots)) if verdict.accepted else None
        if refusal is None:
            return verdict
        verdict.discard()
        return Verdict(409, f"job '{verdict.spec['name']}' cannot run here: {refusal}", dry_run=verdict.dry_run)

    def queue(self, verdict: Verdict, uid: int, user: str) -> JobSummary:
        """Store an accepted job (checked in a child process) as queued."""
        from appliance.config.schema import JobSpec

        upload = Path(verdict.upload_dir) if verdict.upload_dir else None
        # The caps are checked again with the insert, as one step: the check before the admission's (slow) check
        # refuses early, but two submissions of one user both passed it before either was stored.
        with self._queueing:
            try:
                fair_share.check_quota(self, uid, user)
                spec = JobSpec.model_validate(verdict.spec)
            except Exception:
                verdict.discard()
                raise
            return self.supervisor.submit(Accepted(spec, verdict.plan, upload), uid=uid, user=user)

    def delete(self, job_id: str) -> JobDeleted:
        """Remove a finished job: its row and events, its folder and its upload."""
        row = self.supervisor.forget(job_id)
        freed = fair_share.folder_bytes(self.job_dir(job_id))
        uid = row.summary.uid
        self.usage.bytes_by_uid[uid] = max(0, self.usage.bytes_by_uid.get(uid, 0) - freed)
        fair_share.remove(self.job_dir(job_id))
        upload = self._upload_of(row.spec)
        if upload is not None:
            fair_share.remove(upload)
        return JobDeleted(job_id=job_id, freed_bytes=freed)

    def _job_ended(self, _job_id: str, spec: dict) -> None:
        """A job reached a final state: its upload is not needed any more."""
        upload = self._upload_of(spec)
        if upload is not None:
            fair_share.remove(upload)

    def _upload_of(self, spec: dict) -> Path | None:
        """The upload folder a job's dataset lies in, if it was uploaded."""
        dataset = Path(str((spec.get("task") or {}).get("dataset", "")))
        uploads = uploads_dir(self.data_dir)
        return dataset.parent if dataset.parent.parent == uploads else None

    def start_housekeeping(self) -> None:
        self.admission.warm()
        threading.Thread(target=self._housekeeping, name="housekeeping", daemon=True).start()

    def _housekeeping(self) -> None:
        while not self._housekeeping_stop.is_set():
            try:
                self.housekeep()
            except Exception as error:  # keep serving; the error is in the daemon's log
                print(f"housekeeping: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            self._housekeeping_stop.wait(fair_share.USAGE_SECONDS)

    def housekeep(self, now: float | None = None) -> None:
        """Apply the retention rule, remove uploads no live job needs, measure each user's stored bytes."""
        now = time.time() if now is None else now
        jobs = self.store.list()
        for job_id in fair_share.expired(jobs, self.quotas.retention_seconds, now):
            try:
                self.delete(job_id)
            except Exception as error:  # deleted by hand meanwhile, or the disk refuses
                print(f"housekeeping: {job_id}: {error}", file=sys.stderr, flush=True)
                continue
            days = self.quotas.retention_seconds / 86_400
            self.audit.record(
                uid=None, pid=None, action="delete", job_id=job_id, outcome=f"ok: retention ({days:g} days)"
            )
        live = [job for job in self.store.list() if job.state not in TERMINAL_STATES]
        referenced = {str(folder) for job in live if (folder := self._upload_of(self.store.get(job.id).spec))}
        for stale in fair_share.stale_uploads(uploads_dir(self.data_dir), referenced, now):
            fair_share.remove(stale)
        self.usage = fair_share.measure(self)

    def close(self) -> None:
        self._housekeeping_stop.set()
        for pool in (self.control_pool, self.export_pool, self.forward_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        self.admission.close()
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
