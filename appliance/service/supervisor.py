"""Device slots and the workers on them: spawn, report, reap, restart with backoff, pause, cancel, shut down.

One slot per device (the CPU is one slot; on CUDA one per visible GPU, the
worker pinned with CUDA_VISIBLE_DEVICES); a job asking for several devices
gets several contiguous slots, one rank each (service/slot_assignment.py says how, and
the queue rule that keeps it from starving), and its worker starts the ranks through
the launcher `appliance train` uses (ranks.launch_ranks), forked into its own process
group, and ends as they end. A worker is a child process in its
own process group (`process_group=0` at exec, so there is no moment it is
not), and every end of a worker (done, paused, cancelled, crashed) kills the
whole group: vLLM's EngineCore children would otherwise keep the GPU.

Reports from a worker (steps, phases, memory, log lines) are appended to the
job store as events and fed to the daemon's one TrainingMetrics. A worker
that dies is restarted from its newest complete checkpoint after a backoff,
at most `max_restarts` times in a row without a finished step; then the job
fails with the last lines of its log as the reason. A daemon that dies is
charged to no job: nothing a job does reaches the daemon but bounded report
lines (worker.py's Channel), so the job that ran is requeued as it was.

Waiting jobs start in fair-share order across users (fair_share.py), each
user held to the administrator's running cap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.durable import write_atomically
from appliance.errors import ApplianceError
from appliance.paths import STATE_DIR_MODE, STATE_FILE_MODE, jobs_dir
from appliance.service.api import TERMINAL_STATES, DeviceStatus, JobSummary, SlotStatus
from appliance.service.bounded_reads import log_end
from appliance.service.groups import describe_exit, is_worker_group, kill_group, wait_gone
from appliance.service import fair_share, slot_assignment
from appliance.service.reaper import reap_orphans
from appliance.service.job_store import BadTransition, JobRow, JobStore, StoreUnwritable
from appliance.service.worker import EXIT_BAD_JOB, MODULE, Channel

if TYPE_CHECKING:
    from appliance.metrics.training_metrics import TrainingMetrics
    from appliance.service.submission import Accepted

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
REAP_SECONDS = 10.0  # how long a killed job's processes may take to leave before its slot is freed anyway
LOG_TAIL_LINES = 12  # a failed job's reason quotes its log's end: a traceback's last frames and the error


@dataclass(frozen=True)
class Slot:
    index: int
    kind: str  # "cpu" | "cuda"
    name: str
    env: dict[str, str] = field(default_factory=dict)


def probe_slots(environ: dict | None = None, gpus_dir: Path = NVIDIA_GPUS) -> list[Slot]:
    """The hardware boundary: one slot per visible NVIDIA GPU (CUDA_VISIBLE_DEVICES narrows them), else the CPU."""
    environ = os.environ if environ is None else environ
    present = sorted(gpus_dir.iterdir()) if gpus_dir.is_dir() else []
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [part.strip() for part in visible.split(",") if part.strip() and part.strip() != "-1"]
    else:
        ids = [str(index) for index in range(len(present))]
    if not present or not ids:
        return [Slot(0, "cpu", os.uname().machine)]
    return [Slot(index, "cuda", f"GPU {device}", {"CUDA_VISIBLE_DEVICES": device}) for index, device in enumerate(ids)]


def slot_device(slot: Slot):
    """The slot's DeviceInfo for the planner (total and used memory)."""
    from appliance.budget.device_probe import DeviceInfo, probe_device

    if slot.kind == "cpu":
        return probe_device("cpu")
    import torch  # only on a CUDA box

    index = [s.strip() for s in os.environ.get("CUDA_VISIBLE_DEVICES", slot.env["CUDA_VISIBLE_DEVICES"]).split(",")]
    ordinal = index.index(slot.env["CUDA_VISIBLE_DEVICES"]) if slot.env["CUDA_VISIBLE_DEVICES"] in index else 0
    free, total = torch.cuda.mem_get_info(ordinal)
    return DeviceInfo("cuda", int(total), int(total - free), torch.cuda.get_device_name(ordinal), bf16_matmul=True)


@dataclass
class Worker:
    job_id: str
    slot: Slot
    proc: subprocess.Popen
    channel: Channel
    started: float
    reader: threading.Thread | None = None
    stop_reason: str | None = None  # what the daemon asked: "pause" | "shutdown"
    stop_deadline: float | None = None
    cancel_reason: str | None = None
    outcome: dict | None = None  # the worker's last result / disk_full / error message
    fault: str | None = None  # the daemon's own failure that ended the worker (its reports could not be kept)
    phase: str | None = None
    planned_bytes: dict[str, int] = field(default_factory=dict)
    budget_bytes: int | None = None
    measured_bytes: dict[str, int] = field(default_factory=dict)
    device_total_bytes: int = 0
    device_used_bytes: int = 0
    slots: tuple[Slot, ...] = ()  # every slot the job holds, `slot` first

    @property
    def device(self) -> str:
        """The job's `device` label: its slot, or its first-last slots."""
        return slot_assignment.label(self.slots or (self.slot,))


class Supervisor:
    def __init__(
        self,
        store: JobStore,
        data_dir: Path,
        slots: list[Slot],
        metrics: "TrainingMetrics",
        *,
        max_restarts: int = 3,
        backoff_seconds: tuple[float, ...] = (2.0, 4.0, 8.0),
        stop_timeout: float = 120.0,
        version: str = "",
        worker_env: dict[str, str] | None = None,
        max_running_per_user: int = 0,
        slot_seconds: float = 0.0,
    ):
        from prometheus_client import Counter

        self.store, self.data_dir, self.slots, self.metrics = store, Path(data_dir), slots, metrics
        self.max_restarts, self.backoff_seconds, self.stop_timeout = max_restarts, backoff_seconds, stop_timeout
        self.version, self.max_running_per_user = version, max_running_per_user
        self.slot_seconds = slot_seconds  # how long a job may hold slots while another user's job waits
        self.worker_env = dict(worker_env or {})  # set for every worker, over the daemon's own environment
        self.workers: dict[int, Worker] = {}
        self.retry_at: dict[str, float] = {}
        self.last_started: dict[int, float] = {}  # uid -> when a job of theirs last started (fair-share ties)
        self.unsettled: dict[str, tuple[Worker, int]] = {}  # reaped workers whose end the store refused so far
        self.restarts_total = Counter(
            "appliance_worker_restarts", "Workers restarted after they died", registry=metrics.registry
        )
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None

    # ----- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.recover()
        self._publish_counts()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._thread.start()

    def recover(self) -> None:
        """After a start: leftovers of a dead daemon's workers are killed; running/interrupted jobs requeued.

        The daemon's death is charged to no job (its restart count is left as it was): a job reaches the daemon
        only through bounded report lines, so it cannot have caused it. A job without its job.yaml fails."""
        for job in self.store.list(("running", "interrupted", "queued")):
            row = self.store.get(job.id)
            if row.pgid and is_worker_group(row.pgid):
                kill_group(row.pgid)
                wait_gone(row.pgid, 10.0)
            if not (self.job_dir(job.id) / "job.yaml").is_file():
                self.store.transition(job.id, "failed", "its job.yaml is missing (the daemon died during submit)")
                continue
            if job.state == "queued":
                continue
            if job.state == "running":
                self.store.transition(job.id, "interrupted", "the daemon stopped while the job ran")
            self.store.transition(
                job.id, "queued", "requeued at daemon start; resumes from its newest checkpoint", slot=None, pgid=None
            )

    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait(0.5)  # woken by a request; else a tick twice a second reaps and schedules anyway
            self._wake.clear()
            try:
                self.tick()
            except Exception as error:  # keep supervising; the error is in the daemon's log
                print(f"supervisor: {type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def wake(self) -> None:
        self._wake.set()

    def tick(self) -> None:
        with self._lock:
            for worker in list(self.workers.values()):
                if worker.proc.poll() is not None:  # a several-slot job's worker ends once all its ranks have
                    self._reaped(worker)
                elif worker.stop_deadline is not None and time.time() > worker.stop_deadline:
                    kill_group(worker.proc.pid)  # it did not stop in time: the last checkpoint stands
            for worker, returncode in list(self.unsettled.values()):
                self._settle_or_keep(worker, returncode)
            reap_orphans({worker.proc.pid for worker in self.workers.values()})
            self._rotate()
            self._schedule()
        self.metrics.observe_disk(self.data_dir)

    def shutdown(self, timeout: float | None = None) -> None:
        """Ask every worker to checkpoint and stop; kill those still running after `timeout`; mark them interrupted."""
        timeout = self.stop_timeout if timeout is None else timeout
        with self._lock:
            self._closing = True
            for worker in self.workers.values():
                self._ask_stop(worker, "shutdown", timeout)
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                if all(worker.proc.poll() is not None for worker in self.workers.values()):
                    break
            time.sleep(0.1)
        with self._lock:
            for worker in list(self.workers.values()):
                if worker.proc.poll() is None:
                    kill_group(worker.proc.pid)
                    worker.proc.wait()
                self._reaped(worker)
        if self._thread is not None:
            self._wake.set()
            self._thread.join(timeout=5)

    # ----- requests from the control API ---------------------------------------------------------

    def submit(self, accepted: "Accepted", uid: int, user: str) -> JobSummary:
        import yaml

        spec = accepted.spec
        text = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)

        written: list[Path] = []

        def write_job_file(job_id: str) -> None:  # inside the insert's transaction: no row without its file
            folder = self.job_dir(job_id)
            try:
                folder.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
                written.append(folder)
                write_atomically(folder / "job.yaml", text, mode=STATE_FILE_MODE)
            except OSError as error:
                raise StoreUnwritable(
                    f"the job file {folder / 'job.yaml'} could not be written ({error.strerror or error}); "
                    "nothing was submitted. Free space on its file system (or fix the I/O error) and retry"
                ) from error

        try:
            job = self.store.submit(
                spec.name,
                uid,
                user,
                spec.model_dump(mode="json"),
                accepted.plan,
                spec.grpo.steps,
                before_commit=write_job_file,
            )
        except BaseException:
            accepted.discard()
            for folder in written:  # the row was rolled back: so goes its folder
                shutil.rmtree(folder, ignore_errors=True)
            raise
        self._publish_counts()
        self.wake()
        return job

    def pause(self, job_id: str) -> JobSummary:
        with self._lock:
            job = self.store.get(job_id).summary
            worker = self._worker_of(job_id)
            if worker is not None:
                if worker.stop_reason is None:
                    self._ask_stop(worker, "pause", self.stop_timeout)
                return job
            if job.state in ("queued", "interrupted"):
                self.retry_at.pop(job_id, None)
                self.store.transition(
                    job_id,
                    "paused",
                    "paused before it ran" if job.state == "queued" else "paused while waiting to restart",
                )
                self._publish_counts()
                return self.store.get(job_id).summary
            raise BadTransition(f"job '{job_id}' is {job.state}; only a queued or running job can be paused")

    def resume(self, job_id: str) -> JobSummary:
        self.retry_at.pop(job_id, None)  # an interrupted job waiting for its restart goes to the queue now
        job = self.store.transition(
            job_id, "queued", "resumed; continues from its newest checkpoint", expect=("queued",)
        )
        self._publish_counts()
        self.wake()
        return job

    def cancel(self, job_id: str) -> JobSummary:
        with self._lock:
            worker = self._worker_of(job_id)
            if worker is None:
                self.retry_at.pop(job_id, None)
                job = self.store.transition(job_id, "cancelled", "cancelled")
                self._publish_counts()
                return job
            worker.cancel_reason = "cancelled"
            kill_group(worker.proc.pid)
            worker.proc.wait()
            self._reaped(worker)
            self.wake()
            return self.store.get(job_id).summary

    def forget(self, job_id: str) -> JobRow:
        """Delete a finished job's row; under the lock, so never between a settle (a cancel's, a reaped worker's)
        and what follows it: the cancel that ended a job is answered with its state, not "no job"."""
        with self._lock:
            row = self.store.get(job_id)
            if row.summary.state not in TERMINAL_STATES:
                raise BadTransition(
                    f"job '{job_id}' is {row.summary.state}; cancel it first ('appliance jobs cancel {job_id}'), "
                    "then delete it"
                )
            self.store.delete(job_id)
            return row

    def with_phase(self, jobs: list[JobSummary]) -> list[JobSummary]:
        phases = {worker.job_id: worker.phase for worker in list(self.workers.values())}
        return [job.model_copy(update={"phase": phases.get(job.id)}) for job in jobs]

    def device_status(self) -> DeviceStatus:
        slots = []
        holders = {slot.index: worker for worker in self.workers.values() for slot in worker.slots or (worker.slot,)}
        for slot in self.slots:
            worker = holders.get(slot.index)
            status = SlotStatus(index=slot.index, kind=slot.kind, name=slot.name)
            if worker is not None:
                status = status.model_copy(
                    update={
                        "job_id": worker.job_id,
                        "phase": worker.phase,
                        "budget_bytes": worker.budget_bytes,
                        "planned_bytes": dict(worker.planned_bytes),
                        "measured_bytes": dict(worker.measured_bytes),
                        "total_bytes": worker.device_total_bytes,
                        "used_bytes": worker.device_used_bytes,
                    }
                )
            slots.append(status)
        return DeviceStatus(slots=slots, disk_free_bytes=shutil.disk_usage(self.data_dir).free)

    # ----- internals -----------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        return jobs_dir(self.data_dir) / job_id

    def _worker_of(self, job_id: str) -> Worker | None:
        return next((worker for worker in self.workers.values() if worker.job_id == job_id), None)

    def _ask_stop(self, worker: Worker, reason: str, timeout: float) -> None:
        worker.stop_reason = reason
        worker.stop_deadline = time.time() + timeout
        worker.channel.send({"type": "stop", "reason": reason})

    def _rotate(self) -> None:
        """Jobs that held their slots past slot_seconds while another user's job waits checkpoint and requeue."""
        if not self.slot_seconds or self._closing:
            return
        asked = [worker for worker in self.workers.values() if worker.stop_reason is None]
        running = [(worker.job_id, self.store.get(worker.job_id).summary.uid, worker.started) for worker in asked]
        waiting = self.store.list(("queued",)) if running else []
        overdue = set(fair_share.overdue_holders(running, waiting, self.slot_seconds, time.time()))
        for worker in asked:
            if worker.job_id in overdue:
                self._ask_stop(worker, "yield", self.stop_timeout)

    def _schedule(self) -> None:
        """Start what fits: restarts that are due, then the queue in order (service/slot_assignment.py's rule)."""
        if self._closing:
            return
        busy = {slot.index for worker in self.workers.values() for slot in worker.slots or (worker.slot,)}
        if len(busy) == len(self.slots):  # nothing can start: spare the store's queries
            return
        now = time.time()
        due = [job for job in self.store.list(("interrupted",)) if self.retry_at.get(job.id, now + 1) <= now]
        running = self.store.list(("running",))
        wanted = []
        for job in fair_share.fair_order(due + self.store.list(("queued",)), running, self.last_started):
            if fair_share.over_running_cap(job, running, self.max_running_per_user):
                continue  # its user holds their share of slots: passed over, never blocking the others
            spec = self.store.get(job.id).spec
            reason = slot_assignment.unplaceable(spec, len(self.slots))
            if reason:  # waiting would hold up the queue for ever (no back-filling)
                self.retry_at.pop(job.id, None)
                self.store.transition(job.id, "failed", reason)
                continue
            wanted.append(slot_assignment.Waiting(job.id, slot_assignment.slots_wanted(spec)))
        for job_id, slots in slot_assignment.assign(self.slots, busy, wanted):
            restart = self.retry_at.pop(job_id, None) is not None
            where = f"slot {slots[0].index}" if len(slots) == 1 else f"slots {slot_assignment.label(slots)}"
            job = self.store.transition(
                job_id,
                "running",
                f"{'restarted' if restart else 'started'} on {where}",
                slot=slots[0].index,
            )
            self.last_started[job.uid] = time.time()
            self._spawn(job, slots)
            self._publish_counts()

    def _spawn(self, job: JobSummary, slots: list[Slot]) -> None:
        import socket

        job_dir = self.job_dir(job.id)
        job_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
        row = self.store.get(job.id)
        # A first start begins at step 0; every later start resumes from the newest complete checkpoint.
        resume = row.summary.attempts > 0
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-m", MODULE, "--data-dir", str(self.data_dir), "--job-dir", str(job_dir)]
        command += ["--resume"] if resume else []
        slot = slots[0]
        try:
            with open(job_dir / "log.txt", "ab") as log:
                proc = subprocess.Popen(
                    [*command, "--fd", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    process_group=0,
                    env={
                        **os.environ,
                        **self.worker_env,
                        # Every device of the job's slots: the worker places its ranks (and a judge) on them.
                        **slot_assignment.devices_env(slots),
                        "PYTHONUNBUFFERED": "1",  # log.txt gets each line as printed: a crash loses none
                    },
                    cwd=job_dir,
                )
        except OSError as error:  # fork failed (EAGAIN at the pids limit, ENOMEM), or the log cannot be opened
            ours.close()
            theirs.close()
            self._crashed(job.id, None, f"the worker could not be started ({error})")
            return
        theirs.close()
        worker = Worker(job.id, slot, proc, Channel(ours), time.time(), slots=tuple(slots))
        worker.reader = threading.Thread(
            target=self._read_reports, args=(worker,), daemon=True, name=f"reports-{job.id}"
        )
        self.workers[slot.index] = worker
        try:
            self.store.update(
                job.id, attempts=row.summary.attempts + 1, pgid=proc.pid, slot=slot.index, version=self.version
            )
        except StoreUnwritable as error:
            self._fault(worker, f"the job store refused the worker's start ({error})")
        spec = row.spec
        self.metrics.build_info.clear()  # one series: the models of the job that started last
        self.metrics.build_info.labels(
            version=self.version,
            student_model=spec["student"]["model"],
            judge_model=(spec.get("judge") or {}).get("model", ""),
        ).set(1)
        worker.reader.start()

    def _fault(self, worker: Worker, reason: str) -> None:
        """The daemon cannot follow this worker: end its group (so it never blocks sending to a dead reader)."""
        print(f"supervisor: {worker.job_id}: {reason}", file=sys.stderr, flush=True)
        worker.fault = worker.fault or reason
        kill_group(worker.proc.pid)
        self.wake()

    def _read_reports(self, worker: Worker) -> None:
        try:
            self._follow_reports(worker)
        except Exception as error:  # the store refused a write, or a bug: the worker must not run unobserved
            self._fault(worker, f"its reports could not be recorded ({type(error).__name__}: {error})")
        self.wake()

    def _follow_reports(self, worker: Worker) -> None:
        from appliance.grpo.step_record import RunEvent, StepRecord
        from appliance.metrics.engines import SnapshotError
        from appliance.metrics.run_exporter import apply_event

        for message in worker.channel.messages():
            kind = message.get("type")
            try:
                if kind == "step":
                    record = StepRecord.from_dict(message["record"])
                    self.store.add_event(worker.job_id, "step", message["record"], step=record.step, at=record.time)
                    self.store.update(worker.job_id, restarts=0)  # a finished step ends a run of crashes
                    self.metrics.observe_step(record, worker.device)
                    worker.measured_bytes = dict(record.memory.components_used_bytes)
                    if record.memory.device_used_bytes is not None:
                        worker.device_used_bytes = record.memory.device_used_bytes
                elif kind == "event":
                    event = RunEvent.from_dict(message["event"])
                    self._observe_event(worker, event)
                    apply_event(self.metrics, event, worker.device)
                elif kind in ("result", "disk_full", "error"):
                    worker.outcome = message
            # A malformed report is skipped; a store that refuses the write (StoreUnwritable) is not: it
            # reaches _read_reports, which ends the worker rather than let it run unobserved.
            except (KeyError, TypeError, ValueError, SnapshotError) as error:
                print(
                    f"supervisor: bad report from the worker of {worker.job_id}: {error}", file=sys.stderr, flush=True
                )

    def _observe_event(self, worker: Worker, event) -> None:
        data = event.data
        if event.kind == "phase":
            worker.phase = data.get("phase") if data.get("state", "start") == "start" else None
        elif event.kind == "memory" and "planned_bytes" in data:
            worker.planned_bytes = dict(data["planned_bytes"])
            worker.budget_bytes = data.get("budget_bytes")
            worker.device_total_bytes = data.get("device_total_bytes") or 0
            worker.device_used_bytes = data.get("device_used_bytes") or 0
        if event.kind != "engine_metrics":  # snapshots go to the metrics only, not the event history
            self.store.add_event(worker.job_id, event.kind, data, step=event.step, at=event.time)

    def _reaped(self, worker: Worker) -> None:
        """The worker's process is gone: end its group, settle the job's state, free the slot."""
        returncode = worker.proc.wait()
        try:
            kill_group(worker.proc.pid)
            # A rank killed with its launcher may still be exiting (and holding its device's memory): the slot
            # is free only once no process of the job is left.
            wait_gone(worker.proc.pid, REAP_SECONDS)
            if worker.reader is not None:
                worker.reader.join(timeout=10)
            worker.channel.close()
        except Exception as error:  # the job is still settled and the slot freed
            print(f"supervisor: {worker.job_id}: reaping: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        finally:
            self.workers.pop(worker.slot.index, None)
            self.metrics.forget_slot(worker.device)
        self._settle_or_keep(worker, returncode)

    def _settle_or_keep(self, worker: Worker, returncode: int) -> None:
        """Settle a reaped worker's job; while the store refuses writes it is kept and retried every tick."""
        try:
            self._settle(worker, returncode)
            self.store.update(worker.job_id, slot=None, pgid=None)
            self.unsettled.pop(worker.job_id, None)
        except StoreUnwritable as error:
            self.unsettled[worker.job_id] = (worker, returncode)
            print(f"supervisor: {worker.job_id} not settled yet: {error}", file=sys.stderr, flush=True)
            return
        except ApplianceError as error:  # e.g. cancelled by hand meanwhile
            self.unsettled.pop(worker.job_id, None)
            print(f"supervisor: {worker.job_id}: {error}", file=sys.stderr, flush=True)
        except Exception as error:  # a bug: the job must not stay "running" without a worker
            self.unsettled.pop(worker.job_id, None)
            self._settle_failed(worker.job_id, error)
        self._publish_counts()

    def _settle_failed(self, job_id: str, error: Exception) -> None:
        reason = f"the daemon could not settle the job ({type(error).__name__}: {error})"
        print(f"supervisor: {job_id}: {reason}", file=sys.stderr, flush=True)
        try:
            self.store.transition(job_id, "failed", reason, slot=None, pgid=None)
        except ApplianceError:
            pass  # already settled, or the store refuses: recover() at the next start requeues it

    def _settle(self, worker: Worker, returncode: int) -> None:
        job_id, outcome = worker.job_id, worker.outcome or {}
        result = outcome.get("result") or {}
        if worker.cancel_reason:
            self.store.transition(job_id, "cancelled", worker.cancel_reason)
        elif worker.fault:
            self._crashed(job_id, returncode, worker.fault)
        elif outcome.get("type") == "result" and result.get("status") == "completed":
            self.store.transition(job_id, "succeeded", f"completed {result.get('step')} steps")
        elif outcome.get("type") == "result":
            step = result.get("step")
            if (result.get("stop_reason") or worker.stop_reason) == "pause":
                self.store.transition(job_id, "paused", f"paused after step {step} (checkpoint saved)")
            elif worker.stop_reason == "yield":
                self._requeue_yielded(worker, f"after step {step} (checkpoint saved)")
            else:
                self.store.transition(
                    job_id,
                    "interrupted",
                    f"stopped after step {step} (checkpoint saved): the daemon shut down; it resumes at the next start",
                )
        elif outcome.get("type") == "disk_full":
            self.store.transition(job_id, "paused", outcome.get("message", "the disk is full"))
        elif outcome.get("type") == "error" or returncode == EXIT_BAD_JOB:
            self.store.transition(job_id, "failed", outcome.get("message") or self._log_tail(job_id))
        elif worker.stop_reason == "pause":
            self.store.transition(
                job_id,
                "paused",
                f"paused; the worker did not stop in time ({describe_exit(returncode)})"
                ", so it resumes from its newest checkpoint",
            )
        elif worker.stop_reason == "yield":
            self._requeue_yielded(worker, f"(the worker ended with {describe_exit(returncode)}; newest checkpoint)")
        elif worker.stop_reason == "shutdown":
            self.store.transition(
                job_id,
                "interrupted",
                f"the daemon shut down and the worker ended with "
                f"{describe_exit(returncode)}; it resumes from its newest checkpoint",
            )
        else:
            self._crashed(job_id, returncode)

    def _requeue_yielded(self, worker: Worker, where: str) -> None:
        """A job that yielded its slots to other users' waiting jobs goes back to the queue, behind them."""
        hours = self.slot_seconds / 3600
        self.store.transition(worker.job_id, "interrupted", f"held its slot {hours:g} h while others waited")
        job = self.store.transition(
            worker.job_id, "queued", f"yielded its slot {where} to other users' waiting jobs; resumes from it later"
        )
        self.last_started[job.uid] = time.time()  # its user just had a turn: equals go first

    def _crashed(self, job_id: str, returncode: int | None, cause: str | None = None) -> None:
        """A worker that died (or never started): restart after a backoff, or fail after `max_restarts`."""
        restarts = self.store.get(job_id).restarts + 1
        cause = cause or f"the worker ended with {describe_exit(returncode)}"
        if restarts > self.max_restarts:
            self.store.transition(
                job_id,
                "failed",
                f"{cause}; {restarts} times in a row; last lines of its log:\n{self._log_tail(job_id)}",
                slot=None,
                pgid=None,
                restarts=restarts,
            )
            return
        delay = self.backoff_seconds[min(restarts - 1, len(self.backoff_seconds) - 1)]  # the last one repeats
        self.store.transition(
            job_id,
            "interrupted",
            f"{cause}; restart {restarts}/{self.max_restarts} in {delay:g} s from the newest checkpoint",
            slot=None,
            pgid=None,
            restarts=restarts,
        )
        self.retry_at[job_id] = time.time() + delay
        self.restarts_total.inc()

    def _log_tail(self, job_id: str) -> str:
        try:
            lines = log_end(self.job_dir(job_id) / "log.txt").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def _publish_counts(self) -> None:
        self.metrics.set_jobs(self.store.counts())
