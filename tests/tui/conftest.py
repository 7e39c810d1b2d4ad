"""A real daemon for the TUI's Pilot and terminal tests: `appliance serve` on a temporary socket and data dir.

The daemon runs in its own session (process group), so a finalizer ends it and
every worker it started even when a test fails.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from appliance.service.client import Client, ClientError

REPO = Path(__file__).resolve().parents[2]
START_SECONDS = 60.0

# A tiny job: two completions of eight tokens per step, the bundled model, transformers rollouts.
TINY_JOB = {
    "name": "tui-pilot",
    "student": {"model": "smollm2-135m-instruct", "quantization": "none", "lora": {"rank": 8, "alpha": 16}},
    "task": {"dataset": "builtin:multiply", "operand_min": 2, "operand_max": 12, "held_out": 10,
             "system_prompt": "Reply with the answer in the form <answer>N</answer>."},
    "rewards": [{"name": "correctness", "weight": 1.0}, {"name": "answer_format", "weight": 0.5}],
    "grpo": {"group_size": 2, "prompts_per_step": 1, "max_new_tokens": 8, "learning_rate": 5.0e-4, "steps": 40},
    "engine": {"rollout": "hf"},
    "checkpoint": {"every": 1, "keep_last": 1},
}


def tiny_job_yaml(name: str = "tui-pilot", steps: int = 40) -> str:
    return yaml.safe_dump({**TINY_JOB, "name": name, "grpo": {**TINY_JOB["grpo"], "steps": steps}}, sort_keys=False)


class DaemonProcess:
    """`appliance serve` as a child process; start() and stop() may be called again (same socket, same data)."""

    def __init__(self, data_dir: Path, socket_path: Path, log_path: Path):
        self.data_dir, self.socket_path, self.log_path = data_dir, socket_path, log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "appliance", "serve", "--data-dir", str(self.data_dir),
                 "--socket", str(self.socket_path), "--metrics-addr", "127.0.0.1:0", "--stop-timeout", "20"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_SECONDS
        with Client(self.socket_path, timeout=5) as client:
            while True:
                try:
                    client.status()
                    return
                except ClientError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the daemon did not start; its output:\n{self.log_path.read_text()[-3000:]}")
                    time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM (the daemon checkpoints and exits), then SIGKILL to whatever is left of its group."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _run_daemon(data_dir: Path, tmp_path: Path):
    # A short folder for the socket: AF_UNIX paths are limited to about 100 bytes.
    folder = Path(tempfile.mkdtemp(prefix="tui-", dir="/tmp"))
    process = DaemonProcess(data_dir, folder / "control.sock", tmp_path / "daemon.log")
    try:
        process.start()
        yield process
    finally:
        process.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def daemon(fresh_data_dir: Path, tmp_path: Path):
    """A daemon whose model store holds the bundled model."""
    yield from _run_daemon(fresh_data_dir, tmp_path)


@pytest.fixture
def bare_daemon(tmp_path: Path):
    """A daemon with an empty data dir (no models): for tests that run no job."""
    yield from _run_daemon(tmp_path / "data", tmp_path)


async def until(pilot, condition: Callable[[], bool], what: str, timeout: float) -> float:
    """Let the app run until condition() holds; the seconds it took, or a failure naming what never happened."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"after {timeout:.0f}s: {what}\n--- screen ---\n{screen_text(pilot.app)}")
        await pilot.pause(0.2)
    return time.monotonic() - started


async def in_thread(call, *args):
    """A blocking client call from a test's event loop."""
    return await asyncio.to_thread(call, *args)


def screen_text(app) -> str:
    """What the terminal shows now, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def widget_text(app, selector: str) -> str:
    """What the terminal shows now inside one widget's region."""
    region = app.screen.query_one(selector).region
    lines = screen_text(app).splitlines()[region.y:region.y + region.height]
    return "\n".join(line[region.x:region.x + region.width] for line in lines)
