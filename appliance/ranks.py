"""How a job's ranks share a box: the CPU threads each rank may use.

Imports nothing heavy: the daemon reads it to start a job's ranks without loading torch.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# torch starts one thread per core in every process, so N ranks on one box would run N times as many threads as
# it has cores and spend their time switching (bench/README.md, "One rank and two on the demo job"). torchrun's
# command line sets 1 thread a rank; the launcher API that `appliance train` and the daemon use sets nothing, so
# both give each rank its share.


def threads_per_rank(ranks_on_box: int, cores: int | None = None) -> int:
    """Each rank's share of the box's cores, at least one."""
    return max(1, (cores if cores is not None else os.cpu_count() or 1) // max(1, ranks_on_box))


def share_cores(env: MutableMapping[str, str], ranks_on_box: int) -> None:
    """Set OMP_NUM_THREADS to each rank's share, unless the operator already set it."""
    if ranks_on_box > 1:
        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(ranks_on_box)))
