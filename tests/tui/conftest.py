"""Fixtures for the TUI's tests against a real daemon, built on the service tests' tests/daemon_support.py.

Every daemon is stopped (SIGTERM, then SIGKILL) and its workers' process
groups killed at the end, also when a test fails.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from daemon_support import Daemon, daemon_env, free_port, link_model_store, short_tmp_dir


def _run_daemon(data_dir: Path, tmp_path: Path):
    folder = short_tmp_dir()  # AF_UNIX paths must stay short
    daemon = Daemon(
        data_dir, folder / "control.sock", free_port(), tmp_path / "daemon.log", ["--stop-timeout", "30"], daemon_env()
    )
    try:
        yield daemon.start()
    finally:
        daemon.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def daemon(store_data_dir: Path, tmp_path: Path):
    """A daemon whose model store holds the bundled model."""
    yield from _run_daemon(link_model_store(store_data_dir, tmp_path / "data"), tmp_path)


@pytest.fixture
def bare_daemon(tmp_path: Path):
    """A daemon with an empty data dir (no models): for tests that run no job."""
    yield from _run_daemon(tmp_path / "data", tmp_path)
