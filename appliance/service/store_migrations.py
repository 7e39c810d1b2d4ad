"""The job store's schema versions: what each one changed, the migration up to it, and who can still read it.

The meta table holds `schema_version` (the schema the file has) and `readable_by` (the oldest schema whose
code reads and writes it correctly). A migration that only adds (a nullable column, a table, an index) leaves
`readable_by` where it was, so a rollback to the release before runs on the migrated file as it is; one that
changes what older code relies on raises it, and older code then refuses the file in one sentence instead
of misreading it. Before migrating, the daemon keeps a copy of the file as it was (appliance.db.schema-N).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from appliance.durable import fsync_dir
from appliance.errors import ApplianceError


@dataclass(frozen=True)
class Migration:
    to: int
    statements: tuple[str, ...]
    readable_by: int  # the oldest schema that still reads the result
    what: str


# Each entry takes the schema before `to` to `to`, in one transaction.
MIGRATIONS = (
    Migration(
        2,
        ("ALTER TABLE jobs ADD COLUMN version TEXT",),
        readable_by=1,
        what="jobs.version: the appliance version that last started the job's worker",
    ),
)
SCHEMA_VERSION = 2  # images/build-image and images/bundle read this line
assert SCHEMA_VERSION == MIGRATIONS[-1].to


class SchemaError(ApplianceError):
    """The job store file has a schema this appliance cannot read."""

    exit_code = 1


def read_meta(db: sqlite3.Connection) -> tuple[int, int]:
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    version = int(meta.get("schema_version", 1))
    return version, int(meta.get("readable_by", version))


def open_schema(db: sqlite3.Connection, path: Path, fresh: bool) -> None:
    """Bring the opened store to SCHEMA_VERSION, or accept a newer one that still reads as ours, or refuse."""
    if fresh:
        _set_meta(db, SCHEMA_VERSION, _readable_by(SCHEMA_VERSION))
        return
    version, readable_by = read_meta(db)
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        if readable_by <= SCHEMA_VERSION:
            return  # a newer release only added to it: this one reads it as it is
        raise SchemaError(
            f"{path} has job store schema {version}, which only schema {readable_by} or newer can read, and this "
            f"appliance reads schema {SCHEMA_VERSION}: run a newer release, or restore {path}.schema-"
            f"{SCHEMA_VERSION} (the copy taken before the upgrade) while the daemon is stopped"
        )
    _backup(db, path, version)
    db.execute("BEGIN IMMEDIATE")
    try:
        for migration in MIGRATIONS:
            if migration.to > version:
                for statement in migration.statements:
                    db.execute(statement)
        _set_meta(db, SCHEMA_VERSION, _readable_by(SCHEMA_VERSION))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _readable_by(version: int) -> int:
    return max([1] + [m.readable_by for m in MIGRATIONS if m.to <= version])


def _set_meta(db: sqlite3.Connection, version: int, readable_by: int) -> None:
    db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(version),))
    db.execute("INSERT OR REPLACE INTO meta VALUES ('readable_by', ?)", (str(readable_by),))


def _backup(db: sqlite3.Connection, path: Path, version: int) -> None:
    """The file as it was, beside it, once per schema (SQLite's online backup: consistent under WAL), its name
    durable before the migration commits; on a full disk nothing half-copied stays and the store is untouched."""
    copy = path.with_name(f"{path.name}.schema-{version}")
    if copy.exists():
        return
    partial = copy.with_name(copy.name + ".partial")
    try:
        target = sqlite3.connect(partial)
        try:
            db.backup(target)
        finally:
            target.close()
        partial.chmod(path.stat().st_mode & 0o777)
        partial.rename(copy)
        fsync_dir(path.parent)
    except (sqlite3.Error, OSError) as error:
        partial.unlink(missing_ok=True)
        raise SchemaError(
            f"cannot keep a copy of {path} (schema {version}) before migrating it to schema {SCHEMA_VERSION}: "
            f"{error}; the store is unchanged: free space in {path.parent}, then start the appliance again"
        ) from None
