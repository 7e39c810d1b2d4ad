"""The daemon reaps every descendant: it is a child subreaper, and orphans re-parented to it are waited for.

A cancelled worker's group is killed; its grandchildren (vLLM's EngineCore, a reward plugin's helpers) are
then re-parented to the nearest subreaper, the daemon, and stay zombies until it waits for them. Only
processes outside the daemon's own process group and not among its known children are reaped, so the exit
status of a worker's (or a subprocess.run's) Popen is never taken from it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_owned: set[int] = set()  # children other parts of the daemon wait for themselves (exports)
_owned_lock = threading.Lock()


def popen_owned(*args, **kwargs) -> subprocess.Popen:
    """Popen whose child the reaper leaves to the caller; `release(proc)` once it has been waited for."""
    with _owned_lock:
        proc = subprocess.Popen(*args, **kwargs)
        _owned.add(proc.pid)
    return proc


def release(proc: subprocess.Popen) -> None:
    with _owned_lock:
        _owned.discard(proc.pid)


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _group_of(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
        return int(stat[stat.rindex(")") + 2 :].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def reap_orphans(known: set[int]) -> int:
    """Wait for exited children that are neither in `known` nor in our own process group; how many were reaped.

    waitid(WNOWAIT) peeks at one exited child without reaping it; when that child is someone's own
    (a worker, a subprocess.run in another thread), its owner reaps it and we look again on the next call."""
    with _owned_lock:
        return _reap(known | _owned)


def _reap(known: set[int]) -> int:
    own_group, reaped = os.getpgrp(), 0
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if found is None:
            return reaped
        pid = found.si_pid
        # Someone's own child (or one already gone): left for its owner. Peeking again would find it again,
        # so this pass ends here and the next tick looks anew.
        if pid in known or _group_of(pid) in (own_group, None):
            return reaped
        try:
            os.waitpid(pid, os.WNOHANG)
            reaped += 1
        except ChildProcessError:
            return reaped
