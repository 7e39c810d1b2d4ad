"""Host memory the trainer frees goes back to the OS: glibc's mmap threshold pinned at 4 MiB.

glibc serves an allocation above M_MMAP_THRESHOLD with its own mmap, returned
to the OS on free. By default that threshold rises each time such a block is
freed (up to 32 MiB), after which a step's tensors of a few MiB come from the
heap and stay resident when freed. Measured on the CPU (bench/README.md, "Where
the CPU peak RSS above the plan goes"), a trainer of the GRPO benchmark's
workload V peaked at 4.46 GiB with the default and 4.10 GiB with the threshold
pinned at 4 MiB, at the same seconds per step; pinning it at 1 MiB cut the
peak to 3.45 GiB but cost 20% of step time. Setting the threshold also turns
glibc's dynamic adjustment off.

It also makes the peak predictable, which the memory plan needs: with the
dynamic threshold the same gsm8k-cpu step peaked at 7.96 GiB on a quiet box
and 11.15 GiB beside another busy process (not pinned down; likely how much
freed memory glibc keeps in its per-thread arenas, which depends on timing);
pinned, at 7.96 and 8.07 GiB. The plan's CPU constants (budget/components.py)
are fitted with the threshold pinned. No-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 4 * 2**20


def pin_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold for this process; True when glibc took it."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    return mallopt(M_MMAP_THRESHOLD, threshold_bytes) == 1
