"""Host memory the trainer frees goes back to the OS: glibc's mmap threshold pinned (MMAP_THRESHOLD_BYTES).

glibc serves an allocation above M_MMAP_THRESHOLD with its own mmap, returned
to the OS on free. By default that threshold rises each time such a block is
freed (up to glibc's DEFAULT_MMAP_THRESHOLD_MAX), after which a step's tensors of
a few MiB come from the heap and stay resident when freed. Pinning it lowers the CPU peak and makes it
predictable, which the plan's CPU constants (budget/components.py) are fitted
with; the measurements are in bench/README.md ("Where the CPU peak RSS above
the plan goes"). No-op where the C library is not glibc.

What falls under the threshold stays in glibc's heap when freed, where the next
allocations reuse it; `release_freed_heap` hands the free pages back (malloc_trim)
once loading and each rollout are done, so that a phase starts from the memory its
predecessor still holds, not from that phase's peak.

It never fails a job: on another C library every call is a no-op that says False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
# Low enough that the tensors of a step go to mmap and back to the OS, high enough that small ones stay in the
# heap: a lower pin cost step time in page faults (bench/README.md, "Where the CPU peak RSS above the plan goes").
MMAP_THRESHOLD_BYTES = 4 * 2**20


@functools.cache  # looked up once: release_freed_heap runs every step
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    # musl and others also answer to "c" but take no glibc mallopt parameters; only glibc has this symbol.
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def pin_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold for this process; True when glibc took it."""
    libc = _glibc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return mallopt(M_MMAP_THRESHOLD, threshold_bytes) == 1  # mallopt answers 1 on success, 0 on error


def release_freed_heap() -> bool:
    """Return the free pages of glibc's heap to the OS; True when some were returned."""
    libc = _glibc()
    trim = getattr(libc, "malloc_trim", None)
    # pad 0: keep nothing spare at the top of the heap; malloc_trim answers 1 when it released memory.
    return bool(trim(0)) if trim is not None else False
