"""Process groups of workers: kill one, ask whether it lives, recognise a dead daemon's leftover worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from appliance.service.worker import MODULE


def describe_exit(returncode: int) -> str:
    if returncode < 0:  # Popen's convention: -N means killed by signal N
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def kill_group(pgid: int | None, sig: int = signal.SIGKILL) -> None:
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):  # already gone, or the id now belongs to someone else
            pass


def _members(pgid: int):
    """(pid, state) of each process in group `pgid`, read from /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # The command name in parentheses may hold spaces and parentheses: fields start after the last ")".
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:
                yield int(entry.name), fields[0]
        except (OSError, ValueError, IndexError):
            continue


def is_worker_group(pgid: int) -> bool:
    """True when a process of group `pgid` runs this appliance's worker (not a recycled group id)."""
    for pid, _ in _members(pgid):
        try:
            if MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that have not finished exiting (zombies have released everything they held)."""
    return [pid for pid, state in _members(pgid) if state not in ("Z", "X")]


def wait_gone(pgid: int, timeout: float) -> None:
    """Wait until no process of a killed group is left but zombies.

    Every member counts, whatever its command line: an exiting process's cmdline reads empty once its memory
    is released, while it may still hold open files (a device's memory among them)."""
    deadline = time.time() + timeout
    while live_members(pgid) and time.time() < deadline:
        time.sleep(0.05)
