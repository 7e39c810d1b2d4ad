"""Fault injection under the supervisor: fork failing, a full disk and a failing disk (EIO) under the job store,
a worker whose reports cannot be recorded, a daemon killed during submit, restarts capped across daemon starts.

After each fault no job is "running" without a live worker, the slot is free, and a restart (a fresh
supervisor on the same data dir, as at the next daemon start) leaves every job ended or queued with a
reason. Workers here are real processes; the only patch is subprocess.Popen raising the
kernel's EAGAIN (the OS boundary).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from appliance.metrics.training_metrics import TrainingMetrics
from appliance.service.job_store import JobStore, StoreUnwritable
from appliance.service.supervisor import Slot, Supervisor, Worker
from appliance.service.worker import Channel
from disk_support import fill_disk

SPEC = {"name": "t", "student": {"model": "m"}}


def _supervisor(data_dir: Path, max_restarts: int = 2, backoff: float = 0.0) -> Supervisor:
    store = JobStore(data_dir / "appliance.db")
    metrics = TrainingMetrics(version="t", student_model="", judge_model=None)
    return Supervisor(
        store, data_dir, [Slot(0, "cpu", "cpu")], metrics, max_restarts=max_restarts, backoff_seconds=(backoff,)
    )


def _submit(supervisor: Supervisor) -> str:
    def write(job_id: str) -> None:
        folder = supervisor.job_dir(job_id)
        folder.mkdir(parents=True)
        (folder / "job.yaml").write_text("name: t\n")

    return supervisor.store.submit("t", os.getuid(), "u", SPEC, None, 3, before_commit=write).id


def _report_sender(sock: socket.socket) -> subprocess.Popen:
    """A real child that keeps sending event reports down the channel, as a worker does between steps."""
    code = textwrap.dedent(
        """
        import json, socket, sys, time
        sock = socket.socket(fileno=int(sys.argv[1]))
        event = {"type": "event", "event": {"kind": "log", "time": 0.0, "step": 1, "data": {"line": "x" * 200}}}
        while True:
            sock.sendall((json.dumps(event) + "\\n").encode())
            time.sleep(0.01)
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(sock.fileno())], pass_fds=(sock.fileno(),), process_group=0
    )


def _attach(supervisor: Supervisor, job_id: str) -> Worker:
    """Run `job_id` on slot 0 with a real report-sending child, as _spawn would (its reader thread included)."""
    import threading

    supervisor.store.transition(job_id, "running", "started on slot 0", slot=0)
    ours, theirs = socket.socketpair()
    proc = _report_sender(theirs)
    theirs.close()
    worker = Worker(job_id, supervisor.slots[0], proc, Channel(ours), time.time())
    worker.reader = threading.Thread(target=supervisor._read_reports, args=(worker,), daemon=True)
    supervisor.workers[0] = worker
    supervisor.store.update(job_id, pgid=proc.pid)
    worker.reader.start()
    return worker


def _until(predicate, timeout: float = 10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def _no_job_stranded(supervisor: Supervisor) -> None:
    """No job "running" without a live worker (or a settle the store refused, retried each tick); no slot held
    by a dead worker."""
    live = {worker.job_id for worker in supervisor.workers.values() if worker.proc.poll() is None}
    for job in supervisor.store.list(("running",)):
        assert job.id in live or job.id in supervisor.unsettled, f"{job.id} is running without a worker"
    assert all(worker.proc.poll() is None for worker in supervisor.workers.values())


def _after_restart(data_dir: Path) -> dict[str, str]:
    """The daemon starts again on `data_dir`: no job is left running, each has a reason; their states."""
    supervisor = _supervisor(data_dir)
    supervisor.recover()
    jobs = supervisor.store.list()
    supervisor.store.close()
    for job in jobs:
        assert job.state != "running" and (job.reason or job.state == "queued"), job  # queued: waits to run
    return {job.id: job.state for job in jobs}


def test_fork_failing_with_eagain_interrupts_then_fails_the_job_and_frees_the_slot(tmp_path, monkeypatch):
    supervisor = _supervisor(tmp_path, max_restarts=2)
    job_id = _submit(supervisor)

    def no_fork(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", no_fork)
    supervisor.tick()
    job = supervisor.store.get(job_id).summary
    assert job.state == "interrupted" and "could not be started" in job.reason and "Resource temporarily" in job.reason
    assert supervisor.workers == {} and job.slot is None
    for _ in range(3):
        supervisor.tick()
    job = supervisor.store.get(job_id).summary
    assert job.state == "failed" and "3 times in a row" in job.reason
    assert supervisor.workers == {}
    _no_job_stranded(supervisor)
    assert _after_restart(tmp_path) == {job_id: "failed"}


def test_a_full_disk_under_the_database_keeps_reads_and_refuses_writes_clearly(small_disk):
    supervisor = _supervisor(small_disk)
    (small_disk / "jobs").mkdir()
    job_id = _submit(supervisor)
    filler = fill_disk(small_disk)
    with pytest.raises(StoreUnwritable, match="refuses writes .*Free space"):
        for _ in range(200):  # SQLite's WAL may hold a few pages in reserve
            supervisor.store.add_event(job_id, "log", {"line": "y" * 4000})
    with pytest.raises((StoreUnwritable, OSError)):  # the job file or the row: either way it is rolled back
        _submit(supervisor)
    assert [job.id for job in supervisor.store.list()] == [job_id]  # reads still served
    assert supervisor.store.get(job_id).summary.state == "queued"
    filler.unlink()
    supervisor.store.add_event(job_id, "log", {"line": "after"})
    assert supervisor.store.events(job_id=job_id, kinds=("log",))[-1].data == {"line": "after"}
    supervisor.store.close()
    assert _after_restart(small_disk) == {job_id: "queued"}


def test_a_reader_whose_store_refuses_writes_kills_the_worker_frees_the_slot_and_settles_later(small_disk):
    supervisor = _supervisor(small_disk, backoff=600.0)
    (small_disk / "jobs").mkdir()
    job_id = _submit(supervisor)
    worker = _attach(supervisor, job_id)
    _until(lambda: supervisor.store.events(job_id=job_id, kinds=("log",)))
    filler = fill_disk(small_disk)
    assert worker.proc.wait(timeout=20) == -signal.SIGKILL  # the worker is ended, never blocked in sendall
    assert "could not be recorded" in worker.fault
    supervisor.tick()
    assert supervisor.workers == {}  # the slot is free although the store still refuses the settle
    assert job_id in supervisor.unsettled
    _no_job_stranded(supervisor)
    filler.unlink()
    supervisor.tick()
    job = supervisor.store.get(job_id).summary
    assert job.state == "interrupted" and job_id not in supervisor.unsettled and job.slot is None
    assert "could not be recorded" in job.reason and "restart 1/2" in job.reason
    supervisor.store.close()
    assert _after_restart(small_disk) == {job_id: "queued"}


@dataclass
class FailingDisk:
    mount: Path  # ext4, where the job store lives
    backing: Path  # the small tmpfs that holds the ext4 image: fill it and ext4's writes fail with EIO
    image: Path
    loop: str

    def repair(self, filler: Path) -> None:
        """What an administrator does about a failed disk: space for the image, fsck, mount again."""
        filler.unlink()
        subprocess.run(["umount", str(self.mount)], check=True)
        subprocess.run(["e2fsck", "-fy", str(self.loop)], capture_output=True)  # 1: errors fixed
        subprocess.run(["mount", self.loop, str(self.mount)], check=True)


@pytest.fixture
def failing_disk(small_disk, tmp_path):
    """A real EIO: ext4 on a loop device whose sparse image sits on the 8 MiB tmpfs (a 16 MiB image)."""
    if not (shutil.which("losetup") and shutil.which("mkfs.ext4")):
        pytest.skip("needs losetup and mkfs.ext4")
    image = small_disk / "disk.img"
    os.truncate(os.open(image, os.O_CREAT | os.O_WRONLY, 0o600), 16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    attached = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
    if attached.returncode != 0:
        pytest.skip(f"no loop device: {attached.stderr.strip()}")
    loop, mount = attached.stdout.strip(), tmp_path / "ext4"
    mount.mkdir()
    try:
        subprocess.run(["mount", loop, str(mount)], check=True)
        yield FailingDisk(mount, small_disk, image, loop)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", loop], check=False)


def test_eio_under_the_database_ends_the_worker_frees_the_slot_and_a_restart_settles_the_job(failing_disk):
    supervisor = _supervisor(failing_disk.mount, backoff=600.0)
    (failing_disk.mount / "jobs").mkdir()
    job_id = _submit(supervisor)
    worker = _attach(supervisor, job_id)
    _until(lambda: supervisor.store.events(job_id=job_id, kinds=("log",)))
    filler = fill_disk(failing_disk.backing)
    assert worker.proc.wait(timeout=20) == -signal.SIGKILL
    assert "disk I/O error" in worker.fault or "read-only" in worker.fault, worker.fault
    supervisor.tick()
    assert supervisor.workers == {} and job_id in supervisor.unsettled
    _no_job_stranded(supervisor)
    assert supervisor.store.get(job_id).summary.state == "running"  # reads still served; the settle waits
    with pytest.raises(StoreUnwritable, match="refuses writes"):
        supervisor.store.add_event(job_id, "log", {"line": "refused"})
    with contextlib.suppress(sqlite3.Error):
        supervisor.store.close()
    failing_disk.repair(filler)
    states = _after_restart(failing_disk.mount)
    assert states == {job_id: "queued"}  # counted as a restart, resumes from its checkpoint


def test_an_exception_while_reaping_still_settles_the_job_and_frees_the_slot(tmp_path, monkeypatch):
    supervisor = _supervisor(tmp_path)
    job_id = _submit(supervisor)
    worker = _attach(supervisor, job_id)

    def eio() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(worker.channel, "close", eio)
    supervisor.metrics.observe_planned({"student_weights": 100}, 1000, "0")  # as the worker's memory event does
    supervisor.cancel(job_id)
    assert supervisor.metrics.memory_budget.collect()[0].samples == []  # the job's series went with its worker
    job = supervisor.store.get(job_id).summary
    assert job.state == "cancelled" and job.reason == "cancelled" and job.slot is None
    assert supervisor.workers == {} and worker.proc.poll() is not None
    _no_job_stranded(supervisor)
    assert _after_restart(tmp_path) == {job_id: "cancelled"}


def test_an_exception_in_settle_fails_the_job_with_a_reason(tmp_path, monkeypatch):
    supervisor = _supervisor(tmp_path)
    job_id = _submit(supervisor)
    worker = _attach(supervisor, job_id)

    def broken(worker, returncode):
        raise RuntimeError("settle broke")

    monkeypatch.setattr(supervisor, "_settle", broken)
    supervisor.cancel(job_id)
    assert worker.proc.poll() is not None and supervisor.workers == {}
    job = supervisor.store.get(job_id).summary
    assert job.state == "failed" and "settle broke" in job.reason and job.slot is None
    _no_job_stranded(supervisor)
    assert _after_restart(tmp_path) == {job_id: "failed"}


@pytest.mark.parametrize("write_first", [False, True], ids=["before the job file", "after the job file"])
def test_a_daemon_killed_during_submit_leaves_no_job_without_its_file(tmp_path, write_first):
    code = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from appliance.service.job_store import JobStore
        store = JobStore({str(tmp_path / "appliance.db")!r})
        def die(job_id):  # inside the transaction: the row is inserted, not committed
            if {write_first}:
                folder = Path({str(tmp_path)!r}) / "jobs" / job_id
                folder.mkdir(parents=True)
                (folder / "job.yaml").write_text("name: t\\n")
            os.kill(os.getpid(), signal.SIGKILL)
        store.submit("t", 0, "u", {json.dumps(SPEC)!r}, None, 3, before_commit=die)
        """
    ).replace(f"{json.dumps(SPEC)!r}", json.dumps(SPEC))
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == -signal.SIGKILL
    assert (tmp_path / "jobs").is_dir() == write_first  # a folder without a row is no job
    assert _after_restart(tmp_path) == {}
    supervisor = _supervisor(tmp_path)
    assert supervisor.store.list() == []
    # A row committed by an older daemon without its file fails at the next start, with the reason.
    job_id = supervisor.store.submit("t", 0, "u", SPEC, None, 3).id
    supervisor.recover()
    job = supervisor.store.get(job_id).summary
    assert job.state == "failed" and "job.yaml is missing" in job.reason


def test_a_daemon_death_is_charged_to_no_job(tmp_path):
    """The daemon dies (an OOM from something else, a kill) five times while a job runs: the job is requeued
    each time with its restart count untouched, never failed for what it did not cause."""
    job_id = None
    for _start in range(5):
        supervisor = _supervisor(tmp_path, max_restarts=2)
        if job_id is None:
            job_id = _submit(supervisor)
        supervisor.recover()
        row = supervisor.store.get(job_id)
        assert row.summary.state == "queued" and row.restarts == 0, row.summary.reason
        supervisor.store.claim_next(0)  # the daemon dies while the job runs
        supervisor.store.close()
    supervisor = _supervisor(tmp_path, max_restarts=2)
    supervisor.recover()
    job = supervisor.store.get(job_id)
    assert job.summary.state == "queued" and job.restarts == 0
    assert "the daemon stopped while the job ran" in " ".join(
        event.data["reason"] for event in supervisor.store.events(0, job_id, kinds=("state",))
    )


def test_a_workers_report_line_past_the_cap_is_skipped_and_the_reports_after_it_are_read():
    """A job cannot size the daemon's memory through its report channel (nor kill the daemon with it)."""
    from appliance.service.worker import MAX_MESSAGE_CHARS, Channel

    ours, theirs = socket.socketpair()

    def write() -> None:
        with theirs:
            theirs.sendall(b'{"type": "event", "text": "' + b"x" * (MAX_MESSAGE_CHARS + 10) + b'"}\n')
            theirs.sendall((json.dumps({"type": "result", "result": {}}) + "\n").encode())

    writer = threading.Thread(target=write)
    writer.start()
    channel = Channel(ours)
    messages = list(channel.messages())
    writer.join()
    channel.close()
    assert messages == [{"type": "result", "result": {}}]
