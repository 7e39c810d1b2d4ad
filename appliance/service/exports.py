"""The daemon's exports: each in its own process (appliance.export.process), one at a time, queued, cancellable.

Exports load the base model on the CPU, so the whole box is one export slot: a second request waits in FIFO
order, at most MAX_WAITING of them (each waits in one of the daemon's worker threads, which submit, cancel
and pause need too; one more is refused with a 429). A caller has at most one export running or waiting, so
no one holds the slot and the whole queue while another's export is refused. `cancel(job_id)` ends a running
export's process group (its staging folder is then removed here: a killed process runs no cleanup of its own)
and drops its waiting ones, every one asked for before the cancel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable

from appliance.errors import ExportError
from appliance.export.process import MODULE, staging_prefix
from appliance.service.groups import kill_group
from appliance.service.reaper import popen_owned, release


MAX_WAITING = 2  # each waiting export holds a worker thread the other routes need too (see the docstring)


class ExportCancelled(ExportError):
    """The export was cancelled before it finished."""

    http_status = 409


class ExportsBusy(ExportError):
    """Too many exports already wait for the export slot."""

    http_status = 429


@dataclass(frozen=True)
class ExportDone:
    path: Path
    kind: str
    step: int
    manifest: dict


class ExportRunner:
    def __init__(self) -> None:
        self._guard = threading.Condition()  # every field below; waiting exports wait on it for their turn
        self._issued = -1  # the newest ticket handed out: tickets count up from 0
        self._line: deque[tuple[int, str]] = deque()  # the waiting exports (ticket, job), first come first served
        self._busy = False  # an export holds the box's one slot
        self._running: dict[str, subprocess.Popen] = {}
        self._cancelled_upto: dict[str, int] = {}  # a cancel reaches the job's exports issued before it
        self._by_caller: dict[Hashable, str] = {}  # a caller's one running or waiting export: its job

    def run(
        self,
        job_id: str,
        job_dir: Path,
        data_dir: Path,
        out: Path,
        checkpoint: str,
        merged: bool,
        dtype: str,
        caller: Hashable | None = None,
    ) -> ExportDone:
        """Wait for the export slot, export in a child process, return its result (ExportError on failure);
        `caller` (a uid or TCP host) may have only this one export running or waiting."""
        with self._guard:
            if caller is not None and caller in self._by_caller:
                raise ExportsBusy(
                    f"your export of job '{self._by_caller[caller]}' is running or waiting; one export per caller at "
                    "a time: ask again when it has finished, or cancel it (DELETE /jobs/<id>/export)"
                )
            waiting = sum(self.waiting().values())
            if waiting >= MAX_WAITING:
                raise ExportsBusy(
                    f"an export is running and {waiting} more wait for the box's one export slot; ask again "
                    "when one has finished, or cancel one (DELETE /jobs/<id>/export)"
                )
            self._issued += 1
            ticket = self._issued
            self._line.append((ticket, job_id))
            if caller is not None:
                self._by_caller[caller] = job_id
        try:
            with self._turn(job_id, ticket):
                command = [sys.executable, "-m", MODULE, str(job_dir), str(data_dir), str(out), checkpoint]
                command += ["merged" if merged else "adapter", dtype]
                return self._export(job_id, ticket, command, out)
        finally:
            with self._guard:
                self._by_caller.pop(caller, None)

    @contextmanager
    def _turn(self, job_id: str, ticket: int):
        """Hold the export slot from this ticket's turn in the line until the block ends."""
        with self._guard:
            self._guard.wait_for(
                lambda: self._is_cancelled(job_id, ticket) or not self._busy and self._line[0][0] == ticket
            )
            self._line.remove((ticket, job_id))
            if self._is_cancelled(job_id, ticket):
                self._forget_cancel(job_id)
                self._guard.notify_all()  # the next in line may be first now
                raise ExportCancelled(f"the export of job '{job_id}' was cancelled while it waited")
            self._busy = True
        try:
            yield
        finally:
            with self._guard:
                self._busy = False
                self._forget_cancel(job_id)
                self._guard.notify_all()

    def _export(self, job_id: str, ticket: int, command: list[str], out: Path) -> ExportDone:
        with self._guard:
            proc = popen_owned(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
            self._running[job_id] = proc
        try:
            stdout, stderr = proc.communicate()
        finally:
            release(proc)
            if proc.returncode != 0:  # a killed export never ran its own cleanup: its staging folder stays
                _remove_staging(out)
            with self._guard:
                self._running.pop(job_id, None)
                cancelled = self._is_cancelled(job_id, ticket)
        if cancelled:
            raise ExportCancelled(f"the export of job '{job_id}' was cancelled")
        return _answer(proc.returncode, stdout, stderr)

    def waiting(self) -> dict[str, int]:
        """How many exports of each job wait for the slot; a cancelled one no longer counts, even before its
        thread has woken to leave the line."""
        with self._guard:
            return dict(Counter(job for ticket, job in self._line if not self._is_cancelled(job, ticket)))

    def _is_cancelled(self, job_id: str, ticket: int) -> bool:
        return ticket <= self._cancelled_upto.get(job_id, -1)

    def _forget_cancel(self, job_id: str) -> None:
        if job_id not in self._running and all(job != job_id for _, job in self._line):  # each one reached left
            self._cancelled_upto.pop(job_id, None)

    def cancel(self, job_id: str) -> bool:
        """Cancel every running or waiting export of the job; False when it has none."""
        with self._guard:
            proc = self._running.get(job_id)
            if proc is not None and proc.returncode is not None:  # it has ended and been waited for: its id may
                proc = None  # be another process's already, and its answer (done or failed) stands
            if proc is None and job_id not in self.waiting():
                return False
            self._cancelled_upto[job_id] = self._issued  # not the exports asked for after this cancel
            self._guard.notify_all()  # its waiting exports leave the line now
            if proc is not None:
                kill_group(proc.pid)
            return True


def _remove_staging(out: Path) -> None:
    """The staging folders an export process left beside `out` (only one export runs: none is in use)."""
    prefix = staging_prefix(out)
    try:
        beside = list(out.parent.iterdir())
    except FileNotFoundError:  # the export failed before it made its folder
        return
    for leftover in beside:
        if leftover.name.startswith(prefix):  # a name match, not a glob: an export's name is not a pattern
            shutil.rmtree(leftover, ignore_errors=True)


def _answer(returncode: int, stdout: str, stderr: str) -> ExportDone:
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        answer = {}
    if answer.get("ok"):
        return ExportDone(Path(answer["path"]), answer["kind"], int(answer["step"]), answer["manifest"])
    if answer.get("error"):
        raise ExportError(answer["error"])
    tail = "\n".join(stderr.strip().splitlines()[-12:])
    raise ExportError(f"the export process ended with exit code {returncode}:\n{tail}")
