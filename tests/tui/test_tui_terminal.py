"""`appliance-tui` in a real terminal (tmux, 80x24, no COLORTERM) shows a job submitted to a real daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_support import tiny_job

from appliance.service.client import Client

SHOW_WAIT = 30.0


def tui_command(socket_path: Path) -> list[str]:
    """The installed console script when there is one beside this interpreter, else the same entry point."""
    script = Path(sys.executable).with_name("appliance-tui")
    if script.exists():
        return [str(script), "--socket", str(socket_path)]
    return [sys.executable, "-m", "tui.app", "--socket", str(socket_path)]


@pytest.mark.model
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_tui_in_tmux_shows_a_submitted_job(daemon):
    session = f"appliance-tui-{os.getpid()}"
    with Client(daemon.socket_path) as client:
        job = client.submit_text("tmux-check.yaml", tiny_job("tmux-check", steps=2)).job
        env = {key: value for key, value in os.environ.items() if key not in ("COLORTERM", "TMUX")}
        env["TERM"] = "xterm-256color"
        command = " ".join(tui_command(daemon.socket_path))
        started = time.monotonic()
        subprocess.run(
            ["tmux", "-L", session, "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
            check=True,
            env=env,
        )
        try:
            screen = ""
            while time.monotonic() - started < SHOW_WAIT:
                screen = subprocess.run(
                    ["tmux", "-L", session, "capture-pane", "-p", "-t", session], capture_output=True, text=True
                ).stdout
                if "tmux-check" in screen:
                    break
                time.sleep(0.2)
            seconds = time.monotonic() - started
            assert "tmux-check" in screen, f"after {SHOW_WAIT:.0f}s the terminal shows:\n{screen}"
            assert "Daemon unreachable" not in screen
            lines = screen.splitlines()
            assert len(lines) <= 24 and max(map(len, lines)) <= 80
            print(f"appliance-tui showed the job {seconds:.1f}s after it started\n{screen}")
        finally:
            subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True)
            client.cancel(job.id)
