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

import pytest

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


@pytest.fixture
def slow_member():
    """A process leading its own group, ready; killed at the end if the test left it running."""
    member = subprocess.Popen([sys.executable, "-c", SLOW_EXIT], stdout=subprocess.PIPE, process_group=0)
    try:
        assert member.stdout.readline() == b"ready\n"
        yield member
    finally:
        if member.poll() is None:
            os.killpg(member.pid, signal.SIGKILL)
            member.wait()


def test_wait_gone_waits_for_every_member_whatever_its_command_line(slow_member):
    assert live_members(slow_member.pid) == [slow_member.pid]
    kill_group(slow_member.pid, signal.SIGTERM)
    started = time.monotonic()
    wait_gone(slow_member.pid, timeout=10)
    waited = time.monotonic() - started
    slow_member.wait(timeout=5)
    assert waited >= 1.0, f"wait_gone returned after {waited:.2f} s while the member was still exiting"
    assert live_members(slow_member.pid) == []


def test_a_zombie_is_not_a_live_member_and_wait_gone_gives_up_at_its_timeout(slow_member):
    started = time.monotonic()
    wait_gone(slow_member.pid, timeout=0.5)  # nothing killed it: the timeout bounds the wait
    assert 0.4 <= time.monotonic() - started < 5
    os.kill(slow_member.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while live_members(slow_member.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_members(slow_member.pid) == []  # a zombie, not yet waited for, holds nothing
    assert slow_member.poll() == -signal.SIGKILL
