"""audit.jsonl: one line per mutating call on the control API, flushed and fsynced before the answer.

A line: {"time", "uid", "pid", "user", "action", "job_id", "outcome",
"transport"}. On the Unix socket the uid and pid are the caller's, read with
SO_PEERCRED from the connection (never from anything the caller sends; a
caller in another PID namespace has pid 0). On the optional TCP control port
there are none: uid, pid and user are null and "remote" holds the
connection's address (host:port). The file rotates by size (audit.jsonl.1,
.2, ...).

What a caller can repeat at will (refusals, dry runs, the "received" line of a
submission, unauthenticated TCP requests) is "chatter": per caller (a uid, or
a TCP host) the first few lines of each window are written in full and the
rest counted, then summed into one line per caller when the window ends, so
no caller can rotate the history away. Chatter is not fsynced. A line the disk
refuses (full, I/O error) is written to the daemon's log instead, and the
request is answered as it would have been.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from appliance.http_listener import network_of


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# The audit log rotates like the judge log: bounded, whatever the callers send.
MAX_BYTES = 16 * 1024 * 1024
BACKUPS = 5
WINDOW_SECONDS = 60.0
WRITTEN_PER_WINDOW = 20  # chatter lines written in full per caller and window; the rest are counted
# All callers together (many addresses are many callers): lines in full, and callers with a summary line of
# their own, per window; the rest go into one line for the others, so chatter grows the log by a bounded rate.
WRITTEN_ALL_PER_WINDOW = 200
SUMMARIES_PER_WINDOW = 50
MAX_CALLERS = 4096  # callers whose window is tracked; past that, new callers share one
MAX_FIELD = 256  # a path or message longer than this is cut: a caller chooses it


@dataclass
class _Window:
    """One caller's chatter in the current window."""

    start: float
    written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # "action outcome" -> lines counted, not written
    fields: dict = field(default_factory=dict)  # uid / transport / remote of the summary line


class AuditLog:
    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS):
        self.path = Path(path)
        self.max_bytes, self.backups = max_bytes, backups
        self._lock = threading.Lock()
        self._fd = self._open()
        self._windows: dict[tuple, _Window] = {}
        self._all = _Window(time.time())  # every caller's chatter this window, and the others' summary
        self._all_summaries = 0
        self._others_callers = 0

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

    def chatter(self, caller: tuple, **fields) -> None:
        """A line a caller can repeat at will (`fields` as for record()): written in full for the first
        WRITTEN_PER_WINDOW of the caller's window, else counted into the window's summary line."""
        now = time.time()
        with self._lock:
            self._summarise(now)
            if caller not in self._windows and len(self._windows) >= MAX_CALLERS:
                caller = ("others",)
            window = self._windows.setdefault(caller, _Window(now, fields=_who(fields)))
            window.written += 1
            # Only lines written count against everyone's budget: one caller's flood uses its own share of it.
            if window.written > WRITTEN_PER_WINDOW or self._all.written >= WRITTEN_ALL_PER_WINDOW:
                kind = f"{fields['action']} {fields['outcome'].split(':')[0].split(' ')[0]}"  # "submit refused"
                window.dropped[kind] = window.dropped.get(kind, 0) + 1
                return
            self._all.written += 1
        self.record(**fields, durable=False)

    def refused_tcp(self, remote: str, outcome: str) -> None:
        """An unauthenticated TCP request: chatter of its host."""
        self.chatter(
            ("tcp", network_of(remote)),  # a host may send from many addresses (all of 127.0.0.0/8)
            uid=None,
            pid=None,
            action="authenticate",
            job_id=None,
            outcome=outcome,
            transport="tcp",
            remote=remote,
        )

    def _summarise(self, now: float, everything: bool = False) -> None:
        """One line per caller whose window ended (or every caller), counting what was not written (lock held)."""
        for caller, window in list(self._windows.items()):
            if not everything and now - window.start < WINDOW_SECONDS:
                continue
            del self._windows[caller]
            if not window.dropped:
                continue
            if self._all_summaries >= SUMMARIES_PER_WINDOW:  # past the callers with a line of their own
                self._others_callers += 1
                for kind, count in window.dropped.items():
                    self._all.dropped[kind] = self._all.dropped.get(kind, 0) + count
                continue
            self._all_summaries += 1
            self._write_summary(now, window.fields, window)
        if everything or now - self._all.start >= WINDOW_SECONDS:
            if self._all.dropped:
                self._write_summary(
                    now,
                    {"uid": None, "user": None, "transport": "any"},
                    self._all,
                    f" by {self._others_callers} more callers",
                )
            self._all, self._all_summaries, self._others_callers = _Window(now), 0, 0

    def _write_summary(self, now: float, who: dict, window: _Window, whose: str = "") -> None:
        counted = ", ".join(f"{count} {kind}" for kind, count in sorted(window.dropped.items()))
        entry = {
            "time": now,
            **who,
            "action": "summary",
            "job_id": None,
            "outcome": f"{sum(window.dropped.values())} more lines{whose} since {window.start:.0f} not written "
            f"in full: {counted}"[:MAX_FIELD],
        }
        self._write((json.dumps(entry) + "\n").encode(), durable=False)

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
            self._summarise(time.time(), everything=True)
            if self._fd >= 0:
                os.close(self._fd)


def _who(fields: dict) -> dict:
    """The caller part of a line, for its summary."""
    who = {"uid": fields.get("uid"), "user": user_name(fields["uid"]) if fields.get("uid") is not None else None}
    who["transport"] = fields.get("transport", "unix")
    if fields.get("remote"):
        who["remote"] = network_of(fields["remote"])
    return who
