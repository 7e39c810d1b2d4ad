"""Several device slots for one job: which queued job gets which slots, and its ranks as one process group.

A job that asks for `resources.gpus: N` gets N contiguous free slots (on
CUDA each rank is pinned to its own through CUDA_VISIBLE_DEVICES and
LOCAL_RANK, grpo/distributed.py). The ranks are started here rather than by
torch.distributed.run because its launcher puts every rank in a session of
its own, and the daemon ends a job by killing one process group; each rank
gets the environment torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR / MASTER_PORT on loopback), and torch's own env:// rendezvous
joins them. Rank 0 carries the report channel; the others log to
log.rank<R>.txt.

The rule against starving a multi-GPU job: jobs start in queue order, and
no job starts ahead of an older queued job that is waiting for slots (no
back-filling). Slots freed while a 2-GPU job waits stay free until it has
both, so single-GPU jobs submitted after it never keep it out.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from appliance.ranks import share_cores


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


def ranks_of(spec: dict) -> int:
    """Data-parallel ranks on this box: the devices not given to the judge (config/schema.py's rule)."""
    resources = spec.get("resources") or {}
    student = resources.get("student_gpus")
    # An explicit student_gpus wins; else every device the judge does not take trains.
    return int(student) if student else slots_wanted(spec) - int(resources.get("judge_gpus", 0))


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


def free_port() -> int:
    # The kernel's pick, released at once for rank 0 to bind: a race with another process is possible but rare,
    # and a rendezvous that fails ends the job's start like any crash (restarted with backoff).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_environment(
    base: dict[str, str], slots: Sequence[HasIndex], ranks: int, rank: int, port: int
) -> dict[str, str]:
    """What torchrun would set for `rank` of `ranks` on one box, plus the job's devices (the rank keeps its own)."""
    env = {**base, **devices_env(slots), "PYTHONUNBUFFERED": "1"}
    world = str(ranks)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=world,
        LOCAL_WORLD_SIZE=world,
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if slots[0].kind == "cpu":  # ranks on one CPU split its cores instead of each taking them all
        share_cores(env, ranks)
    return env


def start_ranks(
    command: list[str], slots: Sequence[HasIndex], ranks: int, job_dir: Path, channel_fd: int, base_env: dict[str, str]
) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    """Rank 0 (with `--fd channel_fd`, leading a new process group) and ranks 1..ranks-1 in its group.

    `command` is the worker's command without --fd. If a later rank cannot be started, the group is
    killed and the OSError raised, as for a one-slot worker that cannot be forked."""
    import signal

    port = free_port()
    with open(job_dir / "log.txt", "ab") as log:
        leader = subprocess.Popen(
            [*command, "--fd", str(channel_fd)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(channel_fd,),
            process_group=0,  # rank 0 leads a new group: killing it ends every rank, and only them
            env=rank_environment(base_env, slots, ranks, 0, port),
            cwd=job_dir,
        )
    others = []
    try:
        for rank in range(1, ranks):
            with open(job_dir / f"log.rank{rank}.txt", "ab") as log:
                others.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        process_group=leader.pid,
                        env=rank_environment(base_env, slots, ranks, rank, port),
                        cwd=job_dir,
                    )
                )
    except OSError:  # a half-started job must not keep ranks waiting in a rendezvous that cannot complete
        os.killpg(leader.pid, signal.SIGKILL)
        for proc in (leader, *others):
            proc.wait()
        raise
    return leader, others


def failed_rank(ranks: Sequence[subprocess.Popen]) -> subprocess.Popen | None:
    """A rank other than 0 that ended with an error: the others would wait for it in their next collective."""
    return next((proc for proc in ranks if proc.poll() not in (None, 0)), None)
