"""glibc's mmap threshold pinned (budget/host_allocator.py): freed blocks of a few MiB leave the process.

Run in a fresh interpreter each, so that the threshold this process's other tests
moved does not decide the outcome.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import ctypes, sys
    from appliance.budget.host_allocator import pin_mmap_threshold
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    pinned = pin_mmap_threshold() if sys.argv[1] == "pin" else False
    # A 16 MiB block freed first raises glibc's dynamic threshold (to at most 32 MiB) past the blocks that follow.
    first = bytearray(16 * 2**20); del first
    # 384 MiB in blocks of 6 MiB (touched: zero-filled), each followed by a small block that stays alive, as a
    # step's tensors are interleaved with longer-lived objects: the heap cannot shrink from its top.
    blocks, kept = [], []
    for _ in range(64):
        blocks.append(bytearray(6 * 2**20))
        kept.append(bytearray(200 * 2**10))
    peak = rss_mib()
    del blocks
    print(pinned, round(peak), round(rss_mib()))
""")


def probe(mode: str) -> tuple[bool, float, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    pinned, peak, after = out.split()
    return pinned == "True", float(peak), float(after)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_pinned_threshold_returns_freed_6_mib_blocks_and_the_default_keeps_them():
    pinned, peak, after = probe("pin")
    default_pinned, default_peak, default_after = probe("default")
    assert pinned and not default_pinned
    assert peak - after >= 300  # the 384 MiB went back to the OS
    assert default_peak - default_after < 100  # the default kept them in the heap
