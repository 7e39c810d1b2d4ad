"""Each user's fair share of the daemon: caps on waiting jobs, running slots and stored bytes, a queue ordered
across users, and the sweeps that give space back (retention of finished jobs, uploads of ended jobs).

The caps are the administrator's (`appliance serve --max-queued-per-user
...`). The queue is not one FIFO: a waiting job's turn is its rank among its
user's waiting jobs plus the slots its user holds now, so when a slot frees,
the user with the fewest jobs ahead goes next; between equals, the user whose
job started least recently (round robin), then submission order.
A job of a user at the running cap is passed over without blocking others.
Stored bytes are what a user's job folders hold on disk, measured by the
supervisor's sweep every USAGE_SECONDS (so the cap is checked against a
reading at most that old).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from appliance.errors import ApplianceError
from appliance.service.api import TERMINAL_STATES, JobSummary

if TYPE_CHECKING:
    from appliance.service.daemon import Daemon

DEFAULT_MAX_WAITING = 500
# Finished jobs stay until deleted (or a retention), and every member's job list holds every job: without a cap a
# submit-and-cancel loop (4 jobs a second) grew every list and every TUI's start without bound.
DEFAULT_MAX_JOBS = 2000
DEFAULT_MAX_BYTES = 200 * 2**30
# Finished jobs are kept until deleted unless the administrator sets a retention: a new default must never
# delete runs an upgrade finds on the box.
DEFAULT_RETENTION_SECONDS = 0.0
DEFAULT_EXTERNAL_IDLE_SECONDS = 3600.0
# A running job holds its slots this long at most while another user's job waits, then checkpoints and requeues:
# a job of a million steps would otherwise keep the box's one slot for months.
DEFAULT_SLOT_SECONDS = 24 * 3600.0
USAGE_SECONDS = 60.0  # how often stored bytes are measured and the retention rule applied
UPLOAD_GRACE_SECONDS = 600.0  # an upload younger than this may belong to a submission being stored
WAITING_STATES = ("queued", "paused", "interrupted")


class QuotaExceeded(ApplianceError):
    """The caller is at one of their caps; the message names it and what frees it."""

    http_status = 429


@dataclass(frozen=True)
class Quotas:
    """The administrator's caps per user (0: no cap) and the retention of finished jobs (0: kept for ever)."""

    max_waiting: int = DEFAULT_MAX_WAITING
    max_running: int = 0
    max_jobs: int = DEFAULT_MAX_JOBS
    max_bytes: int = DEFAULT_MAX_BYTES
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    external_idle_seconds: float = DEFAULT_EXTERNAL_IDLE_SECONDS
    slot_seconds: float = DEFAULT_SLOT_SECONDS


@dataclass
class Usage:
    """Stored bytes per uid as last measured."""

    bytes_by_uid: dict[int, int] = field(default_factory=dict)
    measured_at: float = 0.0


def check_quota(daemon: "Daemon", uid: int, user: str) -> None:
    """QuotaExceeded when `uid` may not submit one more job now."""
    quotas = daemon.quotas
    mine = [job for job in daemon.store.list(WAITING_STATES) if job.uid == uid]
    if quotas.max_waiting and len(mine) >= quotas.max_waiting:
        raise QuotaExceeded(
            f"{user} has {len(mine)} jobs waiting (queued, paused or interrupted), this daemon's limit per user "
            "(--max-queued-per-user); cancel or delete some, or wait for them to run"
        )
    kept = daemon.store.count_of(uid)
    if quotas.max_jobs and kept >= quotas.max_jobs:
        raise QuotaExceeded(
            f"{user} keeps {kept} jobs (finished ones included), this daemon's limit per user "
            "(--max-jobs-per-user); delete finished ones ('appliance jobs delete ID') to submit more"
        )
    stored = daemon.usage.bytes_by_uid.get(uid, 0)
    if quotas.max_bytes and stored >= quotas.max_bytes:
        raise QuotaExceeded(
            f"{user}'s jobs hold {stored} bytes on disk, this daemon's limit per user is {quotas.max_bytes} "
            "(--max-bytes-per-user); delete finished jobs ('appliance jobs delete ID') to free space"
        )


def fair_order(
    waiting: list[JobSummary], running: Iterable[JobSummary], last_started: dict[int, float] | None = None
) -> list[JobSummary]:
    """`waiting` (in submission order) in the order they should start: by their user's slots held now plus their
    rank among that user's waiting jobs; on a tie, the user whose job started least recently first (round robin:
    a user who just had a slot waits behind one who has not); then by submission."""
    last_started = last_started or {}
    held: dict[int, int] = {}
    for job in running:
        held[job.uid] = held.get(job.uid, 0) + 1
    rank: dict[int, int] = {}
    keyed = []
    for position, job in enumerate(waiting):
        turn = held.get(job.uid, 0) + rank.get(job.uid, 0)
        rank[job.uid] = rank.get(job.uid, 0) + 1
        keyed.append((turn, last_started.get(job.uid, 0.0), position, job))
    return [item[-1] for item in sorted(keyed, key=lambda item: item[:3])]


def overdue_holders(
    running: Iterable[tuple[str, int, float]], waiting: Iterable[JobSummary], slot_seconds: float, now: float
) -> list[str]:
    """Running jobs (job id, uid, started) that have held their slots `slot_seconds` or more while a job of another
    user waits: they yield (checkpoint, requeue). None when `slot_seconds` is 0."""
    if not slot_seconds:
        return []
    waiting_uids = {job.uid for job in waiting}
    return [job_id for job_id, uid, started in running if now - started >= slot_seconds and waiting_uids - {uid}]


def over_running_cap(job: JobSummary, running: Iterable[JobSummary], cap: int) -> bool:
    return bool(cap) and sum(1 for other in running if other.uid == job.uid) >= cap


def folder_bytes(folder: Path) -> int:
    """Bytes a folder holds on disk (allocated blocks, so a sparse file counts what it uses); links not followed."""
    total = 0
    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


def measure(daemon: "Daemon") -> Usage:
    """Stored bytes per uid: each job's folder, summed over the user's jobs."""
    usage: dict[int, int] = {}
    for job in daemon.store.list():
        usage[job.uid] = usage.get(job.uid, 0) + folder_bytes(daemon.job_dir(job.id))
    return Usage(usage, time.time())


def expired(jobs: Iterable[JobSummary], retention_seconds: float, now: float) -> list[str]:
    """Finished jobs older than the retention (none when it is 0)."""
    if not retention_seconds:
        return []
    return [job.id for job in jobs if job.state in TERMINAL_STATES and now - job.updated > retention_seconds]


def stale_uploads(uploads: Path, referenced: set[str], now: float) -> list[Path]:
    """Uploads (and spooled bodies) no waiting or running job names, older than the grace."""
    found = []
    try:
        entries = list(os.scandir(uploads))
    except OSError:
        return []
    for entry in entries:
        try:
            young = now - entry.stat(follow_symlinks=False).st_mtime < UPLOAD_GRACE_SECONDS
        except OSError:
            continue
        if not young and entry.path not in referenced:
            found.append(Path(entry.path))
    return found


def remove(path: Path) -> None:
    """A folder or file, links not followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass
