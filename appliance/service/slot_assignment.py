"""Several device slots for one job: which queued job gets which slots.

A job that asks for `resources.gpus: N` gets N contiguous free slots, all made
visible to its one worker (CUDA_VISIBLE_DEVICES); the worker places its ranks
and its judge on them (ranks.device_layout) and starts the ranks through the
launcher `appliance train` uses (ranks.launch_ranks), forked into its process
group, so the daemon ends a job by ending that one group. Rank 0 carries the
report channel; the others log to log.rank<R>.txt.

The rule against starving a multi-GPU job: jobs start in queue order, and
no job starts ahead of an older queued job that is waiting for slots (no
back-filling). Slots freed while a 2-GPU job waits stay free until it has
both, so single-GPU jobs submitted after it never keep it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class HasIndex(Protocol):
    index: int
    kind: str
    env: dict[str, str]


@dataclass(frozen=True)
class Waiting:
    """A job that could start: its id and how many slots it asks for."""

    job_id: str
    slots: int


def slots_wanted(spec: dict) -> int:
    """Slots a job's (stored, validated) spec asks for on this box: resources.gpus, default 1."""
    return int((spec.get("resources") or {}).get("gpus", 1))


def devices_env(slots: Sequence[HasIndex]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES naming every device of the job's slots (nothing for CPU slots)."""
    devices = [slot.env["CUDA_VISIBLE_DEVICES"] for slot in slots if "CUDA_VISIBLE_DEVICES" in slot.env]
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else {}


def unplaceable(spec: dict, slot_count: int) -> str | None:
    """Why this daemon can never run the job (one sentence), or None."""
    resources = spec.get("resources") or {}
    if int(resources.get("nodes", 1)) > 1:
        return (
            f"the job asks for {resources['nodes']} boxes (resources.nodes) and the daemon runs jobs on its own box; "
            "start it on each box with 'appliance train --nnodes ... --node-rank ...', or set resources.nodes: 1"
        )
    wanted = slots_wanted(spec)
    if wanted > slot_count:
        return (
            f"the job asks for {wanted} devices (resources.gpus) and this daemon has {slot_count} slot(s); "
            f"set resources.gpus to at most {slot_count}"
        )
    return None


def contiguous_free(slots: Sequence[HasIndex], busy: set[int], count: int) -> list[HasIndex] | None:
    """The first run of `count` free slots with consecutive indices, or None."""
    run: list[HasIndex] = []
    for slot in slots:
        if slot.index in busy:
            run = []
            continue
        if run and slot.index != run[-1].index + 1:  # a gap in the indices breaks the run
            run = []
        run.append(slot)
        if len(run) == count:
            return run
    return None


def assign(slots: Sequence[HasIndex], busy: set[int], waiting: Sequence[Waiting]) -> list[tuple[str, list]]:
    """(job id, its slots) for the jobs that start now, in queue order; the first job that does not fit
    stops the walk (the no-back-filling rule of the module docstring)."""
    busy, started = set(busy), []
    for job in waiting:
        found = contiguous_free(slots, busy, job.slots)
        if found is None:
            break
        busy.update(slot.index for slot in found)
        started.append((job.job_id, found))
    return started


def label(slots: Sequence[HasIndex]) -> str:
    """The `device` label and the store's wording of a job's slots: "1" or "0-1"."""
    first, last = slots[0].index, slots[-1].index
    return str(first) if first == last else f"{first}-{last}"
