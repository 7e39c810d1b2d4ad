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


RELEASE_PROBE = textwrap.dedent("""
    import sys
    from appliance.budget.host_allocator import pin_mmap_threshold, release_freed_heap
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    pin_mmap_threshold()
    # 256 MiB in 2 MiB blocks (under the threshold: glibc's heap serves them), each followed by a small block
    # that stays alive, so that freeing them leaves holes the heap cannot give back from its top.
    blocks, kept = [], []
    for _ in range(128):
        blocks.append(bytearray(2 * 2**20))
        kept.append(bytearray(64 * 2**10))
    del blocks
    freed = rss_mib()
    released = release_freed_heap() if sys.argv[1] == "release" else False
    print(released, round(freed), round(rss_mib()))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_releasing_the_freed_heap_returns_blocks_under_the_threshold_that_free_alone_keeps():
    def run(mode: str) -> tuple[bool, float, float]:
        out = subprocess.run(
            [sys.executable, "-c", RELEASE_PROBE, mode], capture_output=True, text=True, check=True
        ).stdout
        released, freed, after = out.split()
        return released == "True", float(freed), float(after)

    released, freed, after = run("release")
    kept_released, kept_freed, kept_after = run("keep")
    assert released and not kept_released
    assert freed - after >= 200  # most of the 256 MiB of holes went back to the OS
    assert kept_freed - kept_after < 20  # without it the heap kept them
    assert after < kept_after - 200
