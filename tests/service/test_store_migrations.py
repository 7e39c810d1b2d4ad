"""The job store's schema version: a store of an older release is migrated up (a copy of it kept first), a newer
store that still reads as ours opens untouched, and one that does not is refused in one sentence, unchanged."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.bundle.box import Release, check_store_readable, InstallError
from appliance.service.job_store import JobStore
from appliance.service.store_migrations import SCHEMA_VERSION, SchemaError

# The store as release 0.1.0 wrote it (schema 1): a fixture of history, never changed.
SCHEMA_1_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, name TEXT NOT NULL, uid INTEGER NOT NULL,
    user TEXT NOT NULL, spec TEXT NOT NULL, plan TEXT, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, updated REAL NOT NULL, step INTEGER NOT NULL DEFAULT 0,
    steps_total INTEGER NOT NULL DEFAULT 0, slot INTEGER, attempts INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0, pgid INTEGER);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, time REAL NOT NULL,
    kind TEXT NOT NULL, step INTEGER, data TEXT NOT NULL);
CREATE INDEX events_by_job ON events (job_id, id);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO jobs (id, name, uid, user, spec, state, created, updated, step, steps_total)
    VALUES ('aaaaaaaaaa', 'paused-one', 1000, 'alice', '{"name": "paused-one"}', 'paused', 1, 2, 3, 10);
INSERT INTO jobs (id, name, uid, user, spec, state, created, updated, steps_total)
    VALUES ('bbbbbbbbbb', 'queued-one', 1001, 'bob', '{"name": "queued-one"}', 'queued', 3, 3, 5);
INSERT INTO events (job_id, time, kind, step, data) VALUES ('aaaaaaaaaa', 2, 'step', 3, '{"step": 3}');
"""


def schema_1_store(folder: Path) -> Path:
    path = folder / "appliance.db"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1_DDL)
    db.commit()
    db.close()
    return path


def store_at(folder: Path, version: int, readable_by: int) -> Path:
    """A store a later release wrote: the current tables, the meta it would leave."""
    path = folder / "appliance.db"
    JobStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
    db.execute("UPDATE meta SET value=? WHERE key='readable_by'", (str(readable_by),))
    db.commit()
    db.close()
    return path


def meta(path: Path) -> dict[str, str]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT key, value FROM meta"))
    finally:
        db.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_schema_1_store_is_migrated_with_every_job_and_a_copy_kept(tmp_path: Path):
    path = schema_1_store(tmp_path)

    store = JobStore(path)
    jobs = {job.id: job for job in store.list()}
    store.update("aaaaaaaaaa", version="0.2.0")
    store.close()

    assert meta(path) == {"schema_version": str(SCHEMA_VERSION), "readable_by": "1"}
    assert {job_id: (job.name, job.state, job.step, job.steps_total) for job_id, job in jobs.items()} == {
        "aaaaaaaaaa": ("paused-one", "paused", 3, 10),
        "bbbbbbbbbb": ("queued-one", "queued", 0, 5),
    }
    copy = tmp_path / "appliance.db.schema-1"
    assert meta(copy) == {"schema_version": "1"}
    db = sqlite3.connect(copy)
    assert db.execute("SELECT COUNT(*) FROM jobs").fetchone() == (2,)
    db.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM jobs WHERE id='aaaaaaaaaa'").fetchone() == ("0.2.0",)
    db.close()


def test_a_newer_store_that_only_added_opens_untouched(tmp_path: Path):
    path = store_at(tmp_path, SCHEMA_VERSION + 1, readable_by=SCHEMA_VERSION)

    JobStore(path).close()

    assert meta(path) == {"schema_version": str(SCHEMA_VERSION + 1), "readable_by": str(SCHEMA_VERSION)}


def test_a_newer_store_this_release_cannot_read_is_refused_in_one_sentence(tmp_path: Path):
    path = store_at(tmp_path, SCHEMA_VERSION + 1, readable_by=SCHEMA_VERSION + 1)
    before = digest(path)

    with pytest.raises(SchemaError) as refused:
        JobStore(path)

    message = str(refused.value)
    assert "\n" not in message and str(path) in message
    assert f"reads schema {SCHEMA_VERSION}" in message and f"{path}.schema-{SCHEMA_VERSION}" in message
    assert digest(path) == before


@settings(max_examples=30, deadline=None)
@given(version=st.integers(1, SCHEMA_VERSION + 4), lag=st.integers(0, 4))
def test_a_store_opens_exactly_when_its_schema_reads_as_ours(tmp_path_factory, version: int, lag: int):
    folder = tmp_path_factory.mktemp("store")
    readable_by = max(1, version - lag)
    path = schema_1_store(folder) if version == 1 else store_at(folder, version, readable_by)
    opens = version <= SCHEMA_VERSION or readable_by <= SCHEMA_VERSION

    try:
        JobStore(path).close()
        opened = True
    except SchemaError:
        opened = False

    assert opened == opens
    assert int(meta(path)["schema_version"]) == max(version, SCHEMA_VERSION if opened else version)


def test_an_install_refuses_a_release_that_cannot_read_the_store_on_disk(tmp_path: Path):
    store_at(tmp_path, SCHEMA_VERSION + 1, readable_by=SCHEMA_VERSION + 1)
    older = Release("0.1.0", SCHEMA_VERSION, ())
    newer = Release("0.3.0", SCHEMA_VERSION + 1, ())

    with pytest.raises(InstallError) as refused:
        check_store_readable(older, tmp_path)
    check_store_readable(newer, tmp_path)

    assert "\n" not in str(refused.value)
    assert f"appliance 0.1.0 reads job store schema {SCHEMA_VERSION}" in str(refused.value)


def test_a_full_disk_before_a_migration_leaves_the_store_as_it_was(tmp_path: Path):
    """ENOSPC while the copy of a schema 1 store is taken (a real one: a tmpfs a copy does not fit on): one
    sentence naming the store and what to free, no half copy left, the store still schema 1 with its jobs."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], check=True)
    try:
        path = schema_1_store(disk)
        db = sqlite3.connect(path)
        db.execute("INSERT INTO events (job_id, time, kind, data) VALUES ('aaaaaaaaaa', 3, 'log', ?)", ("x" * 300_000,))
        db.commit()
        db.close()

        with pytest.raises(SchemaError) as refused:
            JobStore(path)

        assert f"cannot keep a copy of {path}" in str(refused.value) and f"free space in {disk}" in str(refused.value)
        assert not list(disk.glob("*.schema-1*"))
        assert meta(path) == {"schema_version": "1"}
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)
