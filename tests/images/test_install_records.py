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
from appliance.bundle.lifecycle import RELEASES, current

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


def test_a_damaged_drain_record_is_one_sentence_in_status(tmp_path: Path):
    (tmp_path / DRAINED).write_text('["j1", ')  # cut short by a power loss
    one_line_naming(cli("bundle", "status", "--state-dir", str(tmp_path)), tmp_path / DRAINED)


@pytest.mark.parametrize("action", [["status"], ["rollback", "--dry-run"]])
def test_a_state_folder_that_is_not_a_folder_is_one_sentence(tmp_path: Path, action: list[str]):
    (tmp_path / "file").write_text("")
    state = tmp_path / "file" / "state"
    one_line_naming(cli("bundle", *action, "--state-dir", str(state)), state)
