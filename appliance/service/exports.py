"""The daemon's exports: each in its own process (appliance.export.process), one at a time, queued, cancellable.

Exports load the base model on the CPU, so the whole box is one export slot: a second request waits in FIFO
order, at most MAX_WAITING of them (each waits in one of the daemon's worker threads, which submit, cancel
and pause need too; one more is refused with a 429). A caller has at most one export running or waiting, so
no one holds the slot and the whole queue while another's export is refused. `cancel(job_id)` ends a running
export's process group (its staging folder is then removed here: a killed process runs no cleanup of its own)
or drops a queued one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable

from appliance.errors import ExportError
from appliance.export.process import MODULE, staging_prefix
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
        self._slot = threading.Lock()  # one export at a time
        self._guard = threading.Lock()
        self._running: dict[str, subprocess.Popen] = {}
        self._cancelled: set[str] = set()
        self._queued: dict[str, int] = {}
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
            waiting = sum(self._queued.values())
            if waiting >= MAX_WAITING:
                raise ExportsBusy(
                    f"an export is running and {waiting} more wait for the box's one export slot; ask again "
                    "when one has finished, or cancel one (DELETE /jobs/<id>/export)"
                )
            self._queued[job_id] = self._queued.get(job_id, 0) + 1
            if caller is not None:
                self._by_caller[caller] = job_id
        try:
            return self._run_in_slot(job_id, job_dir, data_dir, out, checkpoint, merged, dtype)
        finally:
            with self._guard:
                self._by_caller.pop(caller, None)

    def _run_in_slot(
        self, job_id: str, job_dir: Path, data_dir: Path, out: Path, checkpoint: str, merged: bool, dtype: str
    ) -> ExportDone:
        with self._slot:
            with self._guard:
                self._queued[job_id] -= 1
                if not self._queued[job_id]:
                    del self._queued[job_id]
                if job_id in self._cancelled:
                    self._cancelled.discard(job_id)
                    raise ExportCancelled(f"the export of job '{job_id}' was cancelled while it waited")
                command = [sys.executable, "-m", MODULE, str(job_dir), str(data_dir), str(out), checkpoint]
                command += ["merged" if merged else "adapter", dtype]
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
                    cancelled = job_id in self._cancelled
                    self._cancelled.discard(job_id)
        if cancelled:
            raise ExportCancelled(f"the export of job '{job_id}' was cancelled")
        return _answer(proc.returncode, stdout, stderr)

    def cancel(self, job_id: str) -> bool:
        """Cancel the job's running or queued export; False when it has none."""
        with self._guard:
            proc = self._running.get(job_id)
            if proc is not None and proc.returncode is not None:  # it has ended and been waited for: its id may
                proc = None  # be another process's already, and its answer (done or failed) stands
            if proc is None and job_id not in self._queued:
                return False
            self._cancelled.add(job_id)
            if proc is None:
                return True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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
