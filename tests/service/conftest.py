"""Fixtures for the daemon tests (helpers in tests/daemon_support.py).

`make_daemon` starts fresh daemons per test; `served_job` (module-scoped) is
one daemon that ran one tiny job to the end while a real Prometheus scraped
it, so several tests can look at the same run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from daemon_support import (
    REPO_ROOT,
    Daemon,
    daemon_env,
    free_port,
    link_model_store,
    run_prometheus,
    short_tmp_dir,
    tiny_job,
)
from caller_support import start_shared_daemon
from service_latency import concurrent_status_requests


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs, so that SQLite, the audit log and the job files meet a real ENOSPC (mounting needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0750", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def make_daemon(tmp_path, store_data_dir):
    """Start daemons on fresh data dirs that see the bundled model; all are stopped at the end."""
    started: list[Daemon] = []
    folders: list[Path] = []

    def make(
        args: list[str] | None = None,
        env: dict | None = None,
        data_dir: Path | None = None,
        start: bool = True,
        prefix: list[str] | None = None,
    ) -> Daemon:
        folder = short_tmp_dir()
        folders.append(folder)
        if data_dir is None:
            data_dir = link_model_store(store_data_dir, tmp_path / f"data{len(started)}")
        daemon = Daemon(
            data_dir,
            folder / "control.sock",
            free_port(),
            tmp_path / f"daemon{len(started)}.log",
            ["--stop-timeout", "60", *(args or [])],
            daemon_env(env),
            prefix=list(prefix or []),
        )
        started.append(daemon)
        return daemon.start() if start else daemon

    yield make
    for daemon in started:
        daemon.close()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class ServedJob:
    """A daemon that has run one tiny job to the end, scraped by Prometheus all along."""

    daemon: Daemon
    job_id: str
    prometheus: str
    submit: subprocess.CompletedProcess
    follow_lines: list[tuple[float, str]]
    finished_at: float
    status_latencies: list[float]
    status_errors: list[str]


@pytest.fixture(scope="module")
def served_job(tmp_path_factory, store_data_dir):
    """One daemon, one tiny job submitted with `appliance jobs submit`, followed with `jobs logs --follow`,
    200 concurrent status requests while it trains, and a real Prometheus scraping it every second."""
    tmp = tmp_path_factory.mktemp("served")
    folder = short_tmp_dir()
    data_dir = link_model_store(store_data_dir, tmp / "data")
    daemon = Daemon(
        data_dir, folder / "control.sock", free_port(), tmp / "daemon.log", ["--stop-timeout", "60"], daemon_env()
    )
    try:
        daemon.start()
        with run_prometheus([f"127.0.0.1:{daemon.metrics_port}"]) as prometheus:
            job_file = tmp / "tiny.yaml"
            job_file.write_text(tiny_job("served", steps=3))
            submitted = daemon.cli("submit", str(job_file), "--json")
            assert submitted.returncode == 0, submitted.stderr
            job_id = json.loads(submitted.stdout)["job"]["id"]
            follow = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "appliance",
                    "jobs",
                    "logs",
                    job_id,
                    "--follow",
                    "--socket",
                    str(daemon.socket_path),
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=daemon.env,
                cwd=REPO_ROOT,
            )
            lines: list[tuple[float, str]] = []

            def read_follow() -> None:
                for line in follow.stdout:
                    lines.append((time.time(), line))

            reader = threading.Thread(target=read_follow, daemon=True)
            reader.start()
            daemon.wait_step(job_id, 1)
            latencies, errors = concurrent_status_requests(daemon.socket_path, 200)
            job = daemon.wait_state(job_id, "succeeded")
            finished = job.updated
            try:
                follow.wait(60)
            finally:
                if follow.poll() is None:
                    follow.kill()
            reader.join(10)
            time.sleep(3)  # at least two more scrapes after the last step
            yield ServedJob(daemon, job_id, prometheus, submitted, lines, finished, latencies, errors)
    finally:
        daemon.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def ownership_daemon(make_daemon):
    """A daemon whose socket the callers of tests/service/caller_support.py share, with an admin group."""
    return start_shared_daemon(make_daemon)
