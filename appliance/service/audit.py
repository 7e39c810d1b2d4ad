"""audit.jsonl: one line per mutating call on the control API, flushed and fsynced before the answer.

A line: {"time", "uid", "pid", "user", "action", "job_id", "outcome",
"transport"}. On the Unix socket the uid and pid are the caller's, read with
SO_PEERCRED from the connection (never from anything the caller sends). On the
optional TCP control port there are none: uid, pid and user are null and
"remote" holds the connection's address (host:port). Refused calls are
recorded too, and so is every TCP request refused for its token.
"""

from __future__ import annotations

import json
import os
import pwd
import threading
import time
from pathlib import Path


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class AuditLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        # O_APPEND: every line lands at the end, whatever else writes; 0640: audit is not for everyone.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)

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
    ) -> None:
        entry = {
            "time": time.time(),
            "uid": uid,
            "pid": pid,
            "user": user_name(uid) if uid is not None else None,
            "action": action,
            "job_id": job_id,
            "outcome": outcome,
            "transport": transport,
        }
        if remote is not None:
            entry["remote"] = remote
        line = json.dumps(entry) + "\n"
        with self._lock:
            os.write(self._fd, line.encode())
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)
