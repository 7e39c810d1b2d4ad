"""Durable files (appliance/durable.py): whole or absent, with the mode asked for, the folder fsynced."""

from __future__ import annotations

import os
import stat

import pytest

from appliance import durable


def test_a_file_is_written_whole_with_its_mode_and_replaces_the_old_one(tmp_path):
    path = tmp_path / "sub" / "job.yaml"
    durable.write_atomically(path, "first\n", mode=0o644)
    durable.write_atomically(path, "second\n", mode=0o644)
    assert path.read_text() == "second\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~_umask()
    assert [p.name for p in path.parent.iterdir()] == ["job.yaml"]


def test_private_is_the_default_mode(tmp_path):
    durable.write_atomically(tmp_path / "endpoint.json", "{}")
    assert stat.S_IMODE((tmp_path / "endpoint.json").stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "eval.json"
    durable.write_atomically(path, "old")
    synced = []
    monkeypatch.setattr(durable, "fsync_dir", synced.append)

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durable.os, "fsync", fail)
    with pytest.raises(OSError, match="No space"):
        durable.write_atomically(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]
    assert synced == []


def test_a_leftover_temporary_is_recognised_and_a_finished_file_is_not(tmp_path):
    assert durable.is_temporary(tmp_path / ".eval.json.123.456.tmp")
    assert not durable.is_temporary(tmp_path / "eval.json")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
