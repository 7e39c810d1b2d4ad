"""`appliance train` in a terminal: our lines and a progress bar with the ETA; library chatter only in log.txt."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

import pytest
from tiny_model import tiny_job

pytestmark = pytest.mark.model

NOISE = ("Loading weights", "it/s]")


def _in_a_terminal(argv: list[str], timeout: float = 600) -> str:
    """Run argv with a pseudo-terminal as stdout and stderr (as a person at an SSH prompt would) and read it all."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        argv, stdout=terminal, stderr=terminal, stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "120"}
    )
    os.close(terminal)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        process.wait(timeout=timeout)
        os.close(controller)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


def test_the_terminal_shows_steps_and_a_progress_bar_and_the_log_keeps_the_library_output(
    tiny_model_dir, tmp_path, fresh_data_dir
):
    job = tiny_job(tiny_model_dir, tmp_path, grpo={"steps": 2})
    shown = _in_a_terminal([sys.executable, "-m", "appliance", "train", str(job), "--data-dir", str(fresh_data_dir)])
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # cursor and colour codes of the bar
    lines = [
        line.strip()
        for line in plain.replace("\r", "\n").splitlines()
        if line.strip() and not line.strip().startswith("training ")
    ]  # the bar's own renders
    assert lines[0].startswith("job 'tiny' in ") and "2 steps" in lines[0]
    assert any(line.startswith("step    1/2  reward") for line in lines)
    assert any(line.startswith("step    2/2  reward") for line in lines)
    assert "ETA" in shown  # the rich progress bar
    assert lines[-1].startswith("done: checkpoints in")
    assert not any(noise in shown for noise in NOISE), shown
    log = (fresh_data_dir / "jobs" / "tiny" / "log.txt").read_text()
    assert "Loading weights" in log and "step    2/2" in log


def test_verbose_lets_the_library_output_through(tiny_model_dir, tmp_path, fresh_data_dir):
    job = tiny_job(tiny_model_dir, tmp_path, grpo={"steps": 1})
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "train", str(job), "--data-dir", str(fresh_data_dir), "--verbose"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loading weights" in done.stdout + done.stderr
    assert "step    1/1  reward" in done.stdout and "ETA" not in done.stdout  # no bar when stdout is not a terminal
