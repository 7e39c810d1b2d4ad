"""How a job's processes share a box: which devices the student's ranks and the judge each see, and the CPU
threads each rank may use.

Imports nothing heavy: the daemon reads it to place a job without loading torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

# Where the NVIDIA driver lists the box's GPUs: the hardware boundary that tests replace with a folder of their own.
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


class PlacementError(ValueError):
    """The box does not have the devices a job's placement asks for; the message says how many."""


def visible_devices(environ: Mapping[str, str] = os.environ, gpus_dir: Path = NVIDIA_GPUS) -> list[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES, else every GPU the driver lists; none on a CPU box."""
    present = sorted(gpus_dir.iterdir()) if gpus_dir.is_dir() else []
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [part.strip() for part in listed.split(",") if part.strip() and part.strip() != "-1"]
        return ids if present else []
    return [str(index) for index in range(len(present))]


@dataclass(frozen=True)
class DeviceLayout:
    """One box's devices as a job uses them: one per student rank, then the judge's (its tensor-parallel group)."""

    student: tuple[str, ...]
    judge: tuple[str, ...]


def device_layout(student_devices: int, judge_devices: int, visible: list[str]) -> DeviceLayout:
    """The first `student_devices` visible devices for the student's ranks, the next `judge_devices` for the judge.

    The one rule for placing a job on a box: `appliance train` and the daemon (which hands a job contiguous slots
    and makes exactly those visible) both come here. On a CPU box (no device visible) everything shares the CPU.
    """
    if not visible:
        return DeviceLayout((), ())
    wanted = student_devices + judge_devices
    if len(visible) < wanted:
        raise PlacementError(
            f"the job places {student_devices} student rank(s) and a judge over {judge_devices} device(s) on this "
            f"box, {wanted} in all, and {len(visible)} are visible (CUDA_VISIBLE_DEVICES); lower resources.gpus"
        )
    return DeviceLayout(tuple(visible[:student_devices]), tuple(visible[student_devices:wanted]))


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
