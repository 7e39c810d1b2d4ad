"""Where a process sits in its job, and data-parallel GRPO under torch.distributed.

`process_role` decides once, at the entry, whether this process launches the
ranks, is one of them, or runs the whole job; everything below takes the
`RankInfo` it returns. Ranks are started by torch's launcher (cli/launch.py),
which sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous; gloo on the CPU,
nccl on CUDA. Every rank samples its own groups; the update divides by
step-wide counts summed over ranks, so the summed LoRA gradients equal one
rank's with the whole batch. It must never write a record or a checkpoint:
the trainer's main process does.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from appliance.config.schema import ResourcesSpec
from appliance.errors import ApplianceError
from appliance.ranks import NVIDIA_GPUS, device_layout, visible_devices


class DistributedError(ApplianceError):
    """A data-parallel run cannot go on as asked (e.g. resumed with another world size)."""


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in its job: its rank, the world size, its device; rank 0 is the main process.

    A one-process run is rank 0 of 1; its gather and barrier are immediate, so the trainer runs one loop.
    """

    rank: int
    world_size: int
    local_rank: int
    device: str
    judge_devices: tuple[str, ...] = ()  # a judge on devices of its own: the ids its engine sees (one-rank jobs)

    @property
    def is_main(self) -> bool:
        """The one process that writes records, checkpoints and best/."""
        return self.rank == 0

    @property
    def device_kind(self) -> str:
        return "cuda" if self.device.startswith("cuda") else "cpu"

    @property
    def part(self) -> tuple[int, int]:
        """(rank, world size): which contiguous share of a list this rank takes (`share`)."""
        return self.rank, self.world_size

    def gather(self, value) -> list:
        """Every rank's `value` (a picklable object), in rank order, on every rank."""
        return gather(value)

    def barrier(self) -> None:
        barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (float64), on every rank: how a step's figures add up."""
        return self._reduced(values, torch.float64, "SUM")

    def max(self, values: list[int]) -> list[int]:
        return [int(value) for value in self._reduced(values, torch.int64, "MAX")]

    def _reduced(self, values: list, dtype: torch.dtype, op: str) -> list:
        if self.world_size == 1 or not values:
            return list(values)
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor(values, dtype=dtype, device=device)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return tensor.tolist()


LAUNCHER = "launcher"


def one_process(judge_devices: tuple[str, ...] = ()) -> RankInfo:
    """The whole job in this process: rank 0 of 1 on the default device (the judge, if any, on its own devices)."""
    from appliance.models.causal_lm import default_device

    return RankInfo(rank=0, world_size=1, local_rank=0, device=default_device(), judge_devices=judge_devices)


def process_role(
    resources: ResourcesSpec | None = None,
    several: bool = False,
    environ: MutableMapping[str, str] = os.environ,
    gpus_dir: Path = NVIDIA_GPUS,
) -> RankInfo | str:
    """Where this process sits in its job, decided once at the entry (`appliance train`, the daemon's worker).

    A rank that torch's launcher started (WORLD_SIZE > 1 in its environment); else LAUNCHER when the job wants
    several processes (`several`, or resources with several ranks); else the whole job in this one. Each sees
    its own device of the box's layout (ranks.device_layout) through CUDA_VISIBLE_DEVICES, set before CUDA starts
    so that the process's children (a vLLM engine) land there too; the judge's devices go to its engine.
    """
    world = int(environ.get("WORLD_SIZE", "1"))
    visible = visible_devices(environ, gpus_dir)
    if world > 1:
        local_rank = int(environ.get("LOCAL_RANK", "0"))
        layout = device_layout(int(environ.get("LOCAL_WORLD_SIZE", world)), 0, visible)
        if layout.student:
            environ["CUDA_VISIBLE_DEVICES"] = layout.student[local_rank]
        if environ.get("OMP_NUM_THREADS", "").isdigit():  # a forked rank's pool may predate its share of the box
            torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return RankInfo(int(environ["RANK"]), world, local_rank, device)
    if several or (resources is not None and resources.world_size > 1):
        if resources is not None:  # refused here, before any rank is forked, rather than in every rank
            device_layout(resources.student_devices, 0, visible)
        return LAUNCHER
    layout = device_layout(1, resources.judge_gpus if resources is not None else 0, visible)
    if layout.judge:  # this process keeps the student's device; the judge's engine gets the rest
        environ["CUDA_VISIBLE_DEVICES"] = layout.student[0]
    return one_process(layout.judge)


def init_process_group(info: RankInfo) -> None:
    """Join the job's process group (env:// rendezvous set up by torch.distributed.run)."""
    if dist.is_initialized():
        return
    if info.device.startswith("cuda"):  # the one device process_role left visible
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("gloo")


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def end_rank_process(code: int) -> NoReturn:
    """End a rank's process with `code`, its process group destroyed, without finalizing the interpreter.

    Everything a rank keeps is already written (atomically) and its files closed. Gloo's worker threads can
    still be releasing their last collective's work when the interpreter finalizes; Python ends a thread that
    then takes the GIL inside a C++ destructor, and the process aborts ("terminate called without an active
    exception", SIGABRT) after its steps finished.
    """
    destroy_process_group()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing more to say there
            pass
    os._exit(code)


def check_resumed_together(world: RankInfo, step: int | None) -> None:
    """Every rank resumed from the same checkpoint (`step`: this rank's, None for none), or DistributedError.

    Rank 0 writes the checkpoints; a box that sees another data dir finds none and would train from step 0 beside
    ranks at step N, its adapter and gradients out of step with theirs, until one side ran out of steps.
    """
    if world.world_size == 1:
        return
    mine = -1 if step is None else step
    highest, negated = world.max([mine, -mine])
    if highest != -negated:
        raise DistributedError(
            f"the job's ranks resumed from different checkpoints (steps {-negated} to {highest}, -1: none found); "
            "every box must see the same data dir, where rank 0 writes the checkpoints"
        )


def share(items: list, rank: int, world_size: int) -> list:
    """This rank's contiguous share of items, in order; when they do not split evenly the first ranks take one more
    (a step's groups always split evenly: the job file is checked; held-out problems need not)."""
    base, extra = divmod(len(items), world_size)
    start = rank * base + min(rank, extra)
    return items[start : start + base + (rank < extra)]


class GradientReducer:
    """Sums step-wide counts and LoRA gradients over the ranks.

    A plain all_reduce rather than DDP: the loss of each rank is already
    divided by the counts of the whole step (summed here), so the gradient
    wanted is the SUM over ranks (DDP averages), taken once per optimizer
    step after every micro-batch (DDP would need no_sync around all but the
    last backward, and its wrapper around the peft model's forward, which the
    reference pass calls with the adapter disabled). The adapter is a few MB:
    one flat buffer, one collective.

    lockstep: the base is sharded (grpo/fsdp.py), so every forward is a collective and the
    updater runs as many passes on every rank as on the busiest (`maximum`, `anywhere`).
    """

    def __init__(self, group=None, lockstep: bool = False):
        self.group = group
        self.lockstep = lockstep

    def counts(self, *values: int) -> tuple[int, ...]:
        return self._reduced(values, dist.ReduceOp.SUM)

    def maximum(self, value: int) -> int:
        return self._reduced((value,), dist.ReduceOp.MAX)[0]

    def anywhere(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any."""
        return bool(self.maximum(int(flag)))

    def _reduced(self, values, op) -> tuple[int, ...]:
        tensor = torch.tensor(values, dtype=torch.int64, device=self._device())
        dist.all_reduce(tensor, op=op, group=self.group)
        return tuple(int(v) for v in tensor.tolist())

    def totals(self, *values: float) -> tuple[float, ...]:
        """Each value summed over the ranks (float64), in one collective."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self._device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tuple(float(value) for value in tensor.tolist())

    def largest(self, value: float) -> float:
        """The value's maximum over the ranks."""
        tensor = torch.tensor([value], dtype=torch.float64, device=self._device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return float(tensor.item())

    def gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over ranks (a rank with no samples adds zeros)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for parameter in parameters:
            size = parameter.numel()
            parameter.grad = flat[offset : offset + size].view_as(parameter).clone()
            offset += size

    @staticmethod
    def broadcast_parameters(parameters: list[torch.nn.Parameter]) -> None:
        """Start every rank from rank 0's adapter (as DDP does at construction)."""
        with torch.no_grad():
            for parameter in parameters:
                dist.broadcast(parameter.data, src=0)

    @staticmethod
    def _device() -> str:
        return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def gather(value) -> list:
    """Every rank's `value` (a picklable object), in rank order, on every rank."""
    if not dist.is_initialized():
        return [value]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
