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


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)  # signal 0: only asks whether the group exists
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True


def is_worker_group(pgid: int) -> bool:
    """True when a process of group `pgid` runs this appliance's worker (not a recycled group id)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # The command name in parentheses may hold spaces and parentheses: fields start after the last ")".
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and MODULE.encode() in (entry / "cmdline").read_bytes():
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def wait_gone(pgid: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while is_worker_group(pgid) and time.time() < deadline:
        time.sleep(0.05)
