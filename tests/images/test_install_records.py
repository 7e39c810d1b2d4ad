"""The installer's own records on a bad day: a power loss that left one of them damaged, a state folder that is
not a folder, a full disk. Each ends in one sentence naming the file and what to do, never a traceback, and
`pending` / `current` never hand back anything but what they name (a list of job ids, a release record).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.bundle.box import InstallError, Release
from appliance.bundle.drain import DRAINED, pending
from appliance.bundle.lifecycle import RELEASES, SWITCHING, current, interrupted

REPO_ROOT = Path(__file__).resolve().parents[2]
SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "appliance", *argv], capture_output=True, text=True, env=env)


def one_line_naming(done: subprocess.CompletedProcess, path: Path) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(path) in done.stderr, done.stderr


@SOME
@given(data=st.binary(max_size=64) | st.sampled_from([b"", b'["j1", ', b"{}", b"[1]", b"null", b'"j1"']))
def test_a_damaged_drain_record_names_itself_or_reads_as_job_ids(tmp_path: Path, data: bytes):
    (tmp_path / DRAINED).write_bytes(data)
    try:
        held = pending(tmp_path)
    except InstallError as error:
        assert str(tmp_path / DRAINED) in str(error) and "appliance jobs resume ID" in str(error)
    else:
        assert isinstance(held, list) and all(isinstance(job_id, str) for job_id in held)


@SOME
@given(data=st.binary(max_size=64) | st.sampled_from([b"", b"0.1.0", b"../0.1.0", b"0.1.0\n\xff", b"."]))
def test_a_damaged_release_pointer_names_itself_or_reads_as_the_release(tmp_path: Path, data: bytes):
    Release("0.1.0", 2, ()).write(tmp_path / RELEASES / "0.1.0" / "release.json")
    (tmp_path / "current").write_bytes(data)
    try:
        release = current(tmp_path)
    except InstallError as error:
        assert str(tmp_path) in str(error)
    else:
        assert release is not None and release.version == "0.1.0"


@SOME
@given(data=st.binary(max_size=64) | st.sampled_from([b"", b"0.2.0", b"0.2.0 0.1.0", b"0.2.0 0.1.0 act\xffive"]))
def test_a_swap_journal_cut_short_still_reads_as_an_unfinished_swap(tmp_path: Path, data: bytes):
    """Any bytes in the journal read as a swap that did not finish, and one whose state is unreadable as one that
    ran the service: the rollback that undoes it starts the service rather than leaving it down."""
    (tmp_path / SWITCHING).write_bytes(data)
    target, before, ran = interrupted(tmp_path)
    assert isinstance(target, str) and isinstance(before, str)
    assert ran is True or data.split()[2:] == [b"inactive"]


def test_a_swap_journal_cut_short_is_shown_by_status(tmp_path: Path):
    (tmp_path / SWITCHING).write_bytes(b"0.2.0 0.")
    done = cli("bundle", "status", "--state-dir", str(tmp_path))
    assert done.returncode == 0 and "did not finish" in done.stdout, done.stdout + done.stderr


def test_a_damaged_drain_record_is_one_sentence_in_status(tmp_path: Path):
    (tmp_path / DRAINED).write_text('["j1", ')  # cut short by a power loss
    one_line_naming(cli("bundle", "status", "--state-dir", str(tmp_path)), tmp_path / DRAINED)


@pytest.mark.parametrize("action", [["status"], ["rollback", "--dry-run"]])
def test_a_state_folder_that_is_not_a_folder_is_one_sentence(tmp_path: Path, action: list[str]):
    (tmp_path / "file").write_text("")
    state = tmp_path / "file" / "state"
    one_line_naming(cli("bundle", *action, "--state-dir", str(state)), state)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 64 KiB tmpfs: a real ENOSPC for whatever is written there (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "small"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def test_a_full_disk_while_the_models_are_staged_leaves_nothing_half_copied(
    tmp_path: Path, small_disk: Path, monkeypatch
):
    """ENOSPC copying a model beside the release in use: one sentence naming the file and what to free, and no
    partial folder left to keep the disk full (before: an OSError traceback and .VERSION.partial left behind)."""
    from appliance.bundle import box, lifecycle

    model = tmp_path / "bundle" / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(os.urandom(256 * 1024))
    monkeypatch.setattr(box, "MODELS_DIR", small_disk)

    with pytest.raises(InstallError) as refused:
        lifecycle._stage_models(tmp_path / "bundle", Release("0.2.0", 2, ("tiny",)), None)

    assert "model.safetensors" in str(refused.value) and "No space left on device" in str(refused.value)
    assert f"free space in {small_disk}" in str(refused.value)
    assert list(small_disk.iterdir()) == []
