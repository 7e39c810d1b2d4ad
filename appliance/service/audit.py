"""audit.jsonl: one line per mutating call on the control API, flushed and fsynced before the answer.

A line: {"time", "uid", "pid", "user", "action", "job_id", "outcome",
"transport"}. On the Unix socket the uid and pid are the caller's, read with
SO_PEERCRED from the connection (never from anything the caller sends). On the
optional TCP control port there are none: uid, pid and user are null and
"remote" holds the connection's address (host:port). Refused calls are
recorded too, and so is every 4xx answer. The file rotates by size
(audit.jsonl.1, .2, ...). Refusals are not fsynced, and TCP requests refused
for their token are rate-limited: the first few of each window are written,
the rest summed into one line when the window ends.
A line the disk refuses (full, I/O error) is written to the daemon's log
instead, and the request is answered as it would have been.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import threading
import time
from pathlib import Path


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# The audit log rotates like the judge log: bounded, whatever the callers send.
MAX_BYTES = 16 * 1024 * 1024
BACKUPS = 5
# A flood of unauthenticated refusals is written in full only WRITTEN_PER_WINDOW times per window.
WINDOW_SECONDS = 10.0
WRITTEN_PER_WINDOW = 5  # unauthenticated TCP refusals written in full per window; the rest are counted
MAX_FIELD = 256  # a path or message longer than this is cut: a caller chooses it


class AuditLog:
    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS):
        self.path = Path(path)
        self.max_bytes, self.backups = max_bytes, backups
        self._lock = threading.Lock()
        self._fd = self._open()
        self._window_start, self._in_window, self._dropped = 0.0, 0, 0

    def _open(self) -> int:
        # O_APPEND: every line lands at the end, whatever else writes; 0640: audit is not for everyone.
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)

    def _write(self, line: bytes, durable: bool) -> None:
        """Append one line (the lock held), rotating first when it would pass max_bytes.

        A line the file system refuses (disk full, I/O error) goes to the daemon's log instead: the
        audit log never turns a request's answer, or a refusal's clear error, into a 500."""
        try:
            if self._fd < 0:
                self._fd = self._open()
            if os.fstat(self._fd).st_size + len(line) > self.max_bytes:
                self._rotate()
            os.write(self._fd, line)
            if durable:
                os.fsync(self._fd)
        except OSError as error:
            text = line.decode(errors="replace").strip()
            print(f"appliance serve: {self.path} refused a line ({error}): {text}", file=sys.stderr, flush=True)

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1  # reopened by the next write, also when a rename below fails
        for number in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{number}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{number + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fd = self._open()

    def refused_tcp(self, remote: str, outcome: str) -> None:
        """An unauthenticated TCP request: written in full for the first few of a window, else counted."""
        now = time.time()
        with self._lock:
            if now - self._window_start >= WINDOW_SECONDS:
                self._summarise(now)
                self._window_start, self._in_window = now, 0
            self._in_window += 1
            if self._in_window > WRITTEN_PER_WINDOW:
                self._dropped += 1
                return
        self.record(
            uid=None,
            pid=None,
            action="authenticate",
            job_id=None,
            outcome=outcome,
            transport="tcp",
            remote=remote,
            durable=False,
        )

    def _summarise(self, now: float) -> None:
        if self._dropped:
            entry = {
                "time": now,
                "action": "authenticate",
                "outcome": f"refused: {self._dropped} more unauthenticated TCP requests since {self._window_start:.0f}",
                "transport": "tcp",
            }
            self._write((json.dumps(entry) + "\n").encode(), durable=False)
            self._dropped = 0

    def record(
        self,
        *,
        uid: int | None,
        pid: int | None,
        action: str,
        job_id: str | None,
        outcome: str,
        transport: str = "unix",
        remote: str | None = None,
        durable: bool = True,
    ) -> None:
        entry = {
            "time": time.time(),
            "uid": uid,
            "pid": pid,
            "user": user_name(uid) if uid is not None else None,
            "action": action,
            "job_id": job_id,
            "outcome": outcome[:MAX_FIELD],
            "transport": transport,
        }
        if remote is not None:
            entry["remote"] = remote
        line = json.dumps(entry) + "\n"
        with self._lock:
            self._write(line.encode(), durable)

    def close(self) -> None:
        with self._lock:
            self._summarise(time.time())
            if self._fd >= 0:
                os.close(self._fd)
