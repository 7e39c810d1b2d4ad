"""The daemon's job store: SQLite in WAL mode, one writer (the daemon), one table of allowed transitions.

A job is queued at submit and claimed in FIFO order (the submit sequence).
Every state change goes through `transition`, which checks TRANSITIONS and
appends a "state" event in the same transaction; the events table is
append-only and its id is the cursor the control API's long-poll hands out.
Steps, phases, checkpoints and log lines of a running job are events too, so
one cursor follows everything.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from appliance.text_rules import escaped
from appliance.errors import ApplianceError
from appliance.paths import STATE_FILE_MODE
from appliance.service.api import JOB_STATES, TERMINAL_STATES, JobEvent, JobSummary
from appliance.service.store_migrations import SCHEMA_VERSION, open_schema


MAX_REASON_CHARS = 4096  # a reason may quote a worker's log: kept short, and clean for every terminal

__all__ = ["SCHEMA_VERSION", "JobStore"]

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,   -- FIFO order
    id          TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    uid         INTEGER NOT NULL,
    user        TEXT NOT NULL,
    spec        TEXT NOT NULL,                      -- the validated spec, JSON, frozen at submit
    plan        TEXT,                               -- the memory plan at submit, JSON
    state       TEXT NOT NULL,
    reason      TEXT NOT NULL DEFAULT '',
    created     REAL NOT NULL,
    updated     REAL NOT NULL,
    step        INTEGER NOT NULL DEFAULT 0,
    steps_total INTEGER NOT NULL DEFAULT 0,
    slot        INTEGER,
    attempts    INTEGER NOT NULL DEFAULT 0,         -- worker starts so far
    restarts    INTEGER NOT NULL DEFAULT 0,         -- worker deaths restarted in a row
    pgid        INTEGER,                            -- the running worker's process group
    version     TEXT                                -- the appliance version that last started its worker
);
CREATE TABLE IF NOT EXISTS events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id  TEXT NOT NULL,
    time    REAL NOT NULL,
    kind    TEXT NOT NULL,
    step    INTEGER,
    data    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, id);
"""

# state -> the states it may move to. Terminal states (succeeded, failed, cancelled) move nowhere.
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "paused", "cancelled", "failed"}),  # failed: its files are missing
    "running": frozenset({"succeeded", "failed", "cancelled", "paused", "interrupted"}),
    "interrupted": frozenset({"queued", "running", "paused", "cancelled", "failed"}),
    "paused": frozenset({"queued", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
assert set(TRANSITIONS) == set(JOB_STATES)

_SUMMARY_COLUMNS = "id, name, state, reason, uid, user, created, updated, step, steps_total, slot, attempts"


class StoreError(ApplianceError):
    """A request the job store refuses (unknown job, a transition the table does not allow)."""


class UnknownJob(StoreError):
    http_status = 404


class BadTransition(StoreError):
    http_status = 409


class StoreUnwritable(StoreError):
    """The database refused a write (disk full, I/O error, a lock held too long); reads still work."""

    http_status = 507  # Insufficient Storage: the message says what to free


@dataclass(frozen=True)
class JobRow:
    summary: JobSummary
    spec: dict
    plan: dict | None
    restarts: int
    pgid: int | None


def new_job_id() -> str:
    return secrets.token_hex(5)  # short to type; the UNIQUE id column refuses the rare repeat


class JobStore:
    """Thread-safe (one connection behind a lock); `listeners` are called with each new event id."""

    def __init__(self, path: Path):
        self.path = Path(path)
        # Created owner/group-only; SQLite gives its -wal and -shm files the database's mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, STATE_FILE_MODE))
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        # Reads use their own connection: in WAL mode they never wait for a commit's fsync, so the
        # control API answers while the supervisor writes.
        self._read_db: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self.listeners: list[Callable[[int], None]] = []
        # Called with (job_id, spec) after a job reaches a final state (its upload is removed then).
        self.on_final: list[Callable[[str, dict], None]] = []
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")  # readers never block the writer, nor it them
            self._db.execute("PRAGMA synchronous=FULL")  # a committed transition survives a power cut
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(DDL)
            found = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            open_schema(self._db, self.path, fresh=found is None)
        self._read_db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._read_db.row_factory = sqlite3.Row
        self._read_db.execute("PRAGMA query_only=1")  # the read connection can never write by mistake

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._db.close()
            if self._read_db is not None:
                self._read_db.close()

    def _read(self, query: str, args=()) -> list[sqlite3.Row]:
        with self._read_lock:
            return self._read_db.execute(query, args).fetchall()

    # ----- writing -----------------------------------------------------------------------------

    def _tx(self):
        return _Transaction(self)

    def submit(
        self,
        name: str,
        uid: int,
        user: str,
        spec: dict,
        plan: dict | None,
        steps_total: int,
        before_commit: Callable[[str], None] | None = None,
    ) -> JobSummary:
        """Insert a queued job; `before_commit(job_id)` writes its files inside the transaction, so the job
        becomes visible only once they exist (an error there rolls the row back)."""
        now = time.time()
        with self._tx() as db:
            job_id = new_job_id()
            while db.execute("SELECT 1 FROM jobs WHERE id=?", (job_id,)).fetchone():
                job_id = new_job_id()
            db.execute(
                "INSERT INTO jobs (id, name, uid, user, spec, plan, state, created, updated, steps_total) "
                "VALUES (?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?)",
                (job_id, name, uid, user, json.dumps(spec), json.dumps(plan) if plan else None, now, now, steps_total),
            )
            event = self._append(db, job_id, "state", None, {"from": None, "to": "queued", "reason": "submitted"}, now)
            if before_commit is not None:
                before_commit(job_id)
        self._notify(event)
        return self.get(job_id).summary

    def transition(
        self, job_id: str, to: str, reason: str = "", expect: Iterable[str] | None = None, **columns: Any
    ) -> JobSummary:
        """Move a job to `to` if TRANSITIONS allows it (and it is in `expect`, when given).

        The reason is stored escaped (appliance/text_rules.py) and cut: it may quote what a worker printed."""
        now = time.time()
        reason = escaped(reason)[:MAX_REASON_CHARS]
        with self._tx() as db:
            row = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJob(f"no job '{job_id}'; 'appliance jobs list' shows the jobs")
            state = row["state"]
            # `expect`: the target states this caller accepts, narrower than the table.
            allowed = TRANSITIONS[state] if expect is None else TRANSITIONS[state] & set(expect)
            if to not in allowed:
                raise BadTransition(f"job '{job_id}' is {state}; it cannot become {to}")
            sets = ", ".join(f"{column}=?" for column in columns)
            db.execute(
                f"UPDATE jobs SET state=?, reason=?, updated=?{', ' + sets if sets else ''} WHERE id=?",
                (to, reason, now, *columns.values(), job_id),
            )
            event = self._append(db, job_id, "state", None, {"from": state, "to": to, "reason": reason}, now)
        self._notify(event)
        row = self.get(job_id)
        if to in TERMINAL_STATES:
            for callback in list(self.on_final):
                callback(job_id, row.spec)
        return row.summary

    def update(self, job_id: str, **columns: Any) -> None:
        """Columns other than the state (step, slot, pgid, attempts, restarts)."""
        if "state" in columns:
            raise ValueError("states change only through transition()")
        sets = ", ".join(f"{column}=?" for column in columns)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE id=?", (*columns.values(), job_id))

    def add_event(self, job_id: str, kind: str, data: dict, step: int | None = None, at: float | None = None) -> int:
        with self._tx() as db:
            event = self._append(db, job_id, kind, step, data, at or time.time())
            if kind == "step" and step is not None:  # the job's progress moves in the same transaction as its event
                db.execute("UPDATE jobs SET step=? WHERE id=?", (step, job_id))
        self._notify(event)
        return event

    def delete(self, job_id: str) -> None:
        """Remove a job and its events (the caller checked that it has finished)."""
        with self._tx() as db:
            if db.execute("DELETE FROM jobs WHERE id=?", (job_id,)).rowcount == 0:
                raise UnknownJob(f"no job '{job_id}'; 'appliance jobs list' shows the jobs")
            db.execute("DELETE FROM events WHERE job_id=?", (job_id,))

    def claim_next(self, slot: int) -> JobSummary | None:
        """The oldest queued job, now running on `slot` (None when the queue is empty)."""
        with self._lock:
            row = self._db.execute("SELECT id FROM jobs WHERE state='queued' ORDER BY seq LIMIT 1").fetchone()
            if row is None:
                return None
            return self.transition(row["id"], "running", f"started on slot {slot}", slot=slot)

    @staticmethod
    def _append(db: sqlite3.Connection, job_id: str, kind: str, step: int | None, data: dict, at: float) -> int:
        cursor = db.execute(
            "INSERT INTO events (job_id, time, kind, step, data) VALUES (?, ?, ?, ?, ?)",
            (job_id, at, kind, step, json.dumps(data, default=float)),
        )
        return int(cursor.lastrowid)

    def _notify(self, event_id: int) -> None:
        for listener in list(self.listeners):
            listener(event_id)

    # ----- reading -----------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRow:
        rows = self._read(f"SELECT {_SUMMARY_COLUMNS}, spec, plan, restarts, pgid FROM jobs WHERE id=?", (job_id,))
        row = rows[0] if rows else None
        if row is None:
            raise UnknownJob(f"no job '{job_id}'; 'appliance jobs list' shows the jobs")
        return JobRow(
            _summary(row),
            json.loads(row["spec"]),
            json.loads(row["plan"]) if row["plan"] else None,
            row["restarts"],
            row["pgid"],
        )

    def list(self, states: Iterable[str] | None = None) -> list[JobSummary]:
        query, args = f"SELECT {_SUMMARY_COLUMNS} FROM jobs", ()
        if states is not None:
            states = tuple(states)
            query += f" WHERE state IN ({', '.join('?' * len(states))})"
            args = states
        rows = self._read(query + " ORDER BY seq", args)
        return [_summary(row) for row in rows]

    def count_of(self, uid: int) -> int:
        """How many jobs `uid` owns, in any state."""
        return self._read("SELECT COUNT(*) AS n FROM jobs WHERE uid = ?", (uid,))[0]["n"]

    def counts(self) -> dict[str, int]:
        rows = self._read("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
        counts = {state: 0 for state in JOB_STATES}
        counts.update({row["state"]: row["n"] for row in rows})
        return counts

    def events(
        self, after: int = 0, job_id: str | None = None, kinds: Iterable[str] | None = None, limit: int = 1000
    ) -> list[JobEvent]:
        query, args = "SELECT id, job_id, time, kind, step, data FROM events WHERE id > ?", [after]
        if job_id is not None:
            query += " AND job_id = ?"
            args.append(job_id)
        if kinds is not None:
            kinds = tuple(kinds)
            query += f" AND kind IN ({', '.join('?' * len(kinds))})"
            args += kinds
        rows = self._read(query + " ORDER BY id LIMIT ?", (*args, limit))
        return [
            JobEvent(
                id=row["id"],
                job_id=row["job_id"],
                time=row["time"],
                kind=row["kind"],
                step=row["step"],
                data=json.loads(row["data"]),
            )
            for row in rows
        ]

    def last_event_id(self) -> int:
        return int(self._read("SELECT MAX(id) FROM events")[0][0] or 0)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT under the store's lock (ROLLBACK on error)."""

    def __init__(self, store: JobStore):
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            # IMMEDIATE: the write lock is taken now, so a busy database fails here, before any change is made.
            self.store._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            self.store._lock.release()
            raise _unwritable(self.store.path, error) from error
        return self.store._db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                try:
                    self.store._db.execute("COMMIT")
                    return
                except sqlite3.Error as error:
                    _rollback(self.store._db)
                    raise _unwritable(self.store.path, error) from error
            _rollback(self.store._db)
            if isinstance(exc, sqlite3.Error):
                raise _unwritable(self.store.path, exc) from exc
        finally:
            self.store._lock.release()


def _rollback(db: sqlite3.Connection) -> None:
    try:
        if db.in_transaction:
            db.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # the transaction is gone already (SQLite rolls back itself on some I/O errors)


def _unwritable(path: Path, error: sqlite3.Error) -> StoreUnwritable:
    return StoreUnwritable(
        f"the job store {path} refuses writes ({error}); the daemon keeps serving reads. "
        "Free space on its file system (or fix the I/O error) and retry"
    )


def _summary(row: sqlite3.Row) -> JobSummary:
    return JobSummary(
        id=row["id"],
        name=row["name"],
        state=row["state"],
        reason=row["reason"],
        uid=row["uid"],
        user=row["user"],
        created=row["created"],
        updated=row["updated"],
        step=row["step"],
        steps_total=row["steps_total"],
        slot=row["slot"],
        attempts=row["attempts"],
    )
