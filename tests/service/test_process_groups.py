"""A killed job's slot is freed only once every process of its group has finished exiting.

The group here is real: a leader and a member that takes a while to exit after SIGTERM (as a rank does while
it tears down a large address space), whose command line is not the worker's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from appliance.service.groups import kill_group, live_members, wait_gone

SLOW_EXIT = textwrap.dedent(
    """
    import signal, sys, time
    def leave(*_):
        time.sleep(1.5)  # still exiting: a device's memory would still be held here
        sys.exit(0)
    signal.signal(signal.SIGTERM, leave)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_wait_gone_waits_for_every_member_whatever_its_command_line():
    member = subprocess.Popen([sys.executable, "-c", SLOW_EXIT], stdout=subprocess.PIPE, process_group=0)
    try:
        assert member.stdout.readline() == b"ready\n"
        assert live_members(member.pid) == [member.pid]
        kill_group(member.pid, signal.SIGTERM)
        started = time.monotonic()
        wait_gone(member.pid, timeout=10)
        waited = time.monotonic() - started
        member.wait(timeout=5)
        assert waited >= 1.0, f"wait_gone returned after {waited:.2f} s while the member was still exiting"
        assert live_members(member.pid) == []
    finally:
        if member.poll() is None:
            os.killpg(member.pid, signal.SIGKILL)
            member.wait()


def test_a_zombie_is_not_a_live_member_and_wait_gone_gives_up_at_its_timeout():
    member = subprocess.Popen([sys.executable, "-c", SLOW_EXIT], stdout=subprocess.PIPE, process_group=0)
    try:
        assert member.stdout.readline() == b"ready\n"
        started = time.monotonic()
        wait_gone(member.pid, timeout=0.5)  # nothing killed it: the timeout bounds the wait
        assert 0.4 <= time.monotonic() - started < 5
        os.kill(member.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while live_members(member.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live_members(member.pid) == []  # a zombie, not yet waited for, holds nothing
        assert member.poll() == -signal.SIGKILL
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
