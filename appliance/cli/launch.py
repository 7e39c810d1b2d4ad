"""`appliance train` for a job of several ranks: torch.distributed.run's launcher starts them, not ours.

One launcher per box (node) starts `resources` student ranks as
`python -m appliance train FILE ...` with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, the rendezvous); each rank then runs the job through
grpo/trainer.py. One box: a c10d rendezvous on a free loopback port.
Several boxes: --nnodes / --node-rank / --rdzv-endpoint, or the variables
Slurm sets (SLURM_NNODES, SLURM_NODEID, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from appliance.config.schema import JobSpec
from appliance.errors import ApplianceError
from appliance.ranks import share_cores


class LaunchError(ApplianceError):
    """The ranks cannot be started as asked; the message says what to change."""


def add_launch_arguments(parser) -> None:
    parser.add_argument("--nnodes", type=int, default=None, help="boxes in the job (default: resources.nodes)")
    parser.add_argument("--node-rank", type=int, default=None, help="this box's rank, 0 .. nnodes-1")
    parser.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="the rendezvous of a several-box job (node rank 0's address on the lab network)",
    )


@dataclass(frozen=True)
class Topology:
    nnodes: int
    node_rank: int | None
    endpoint: str | None
    nproc_per_node: int


def topology(args, spec: JobSpec, environ=os.environ) -> Topology:
    """The launch's shape from the flags, else Slurm's variables, else the job's resources."""
    nnodes = args.nnodes or _int(environ.get("SLURM_NNODES")) or spec.resources.nodes
    node_rank = args.node_rank if args.node_rank is not None else _int(environ.get("SLURM_NODEID"))
    endpoint = args.rdzv_endpoint
    if endpoint is None and environ.get("MASTER_ADDR") and nnodes > 1:
        endpoint = f"{environ['MASTER_ADDR']}:{environ.get('MASTER_PORT', '29500')}"
    if nnodes != spec.resources.nodes:
        raise LaunchError(
            f"{nnodes} nodes asked, but the job's resources.nodes is {spec.resources.nodes}; set resources.nodes: "
            f"{nnodes} (each rank's share of the prompts follows from it)"
        )
    if nnodes > 1 and not endpoint:
        raise LaunchError("a job on several boxes needs --rdzv-endpoint HOST:PORT (node rank 0's address)")
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise LaunchError(f"--node-rank {node_rank} is outside 0..{nnodes - 1}")
    if nnodes > 1 and node_rank is None:
        raise LaunchError("a job on several boxes needs --node-rank (0 on the box at --rdzv-endpoint)")
    return Topology(nnodes, node_rank, endpoint, spec.resources.student_devices)


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def rank_command(args, data_dir: Path) -> list[str]:
    """What each rank runs: this same command, resumed when asked (the job folder is already prepared).

    --eval goes to every rank: each evaluates the same adapter (the weights are all-reduced) on the same
    held-out problems, greedy, so they agree, and the ranks reach their next collective together.
    """
    command = ["-m", "appliance", "train", str(Path(args.file).resolve()), "--data-dir", str(data_dir)]
    if args.resume:
        command.append("--resume")
    if args.eval:
        command.append("--eval")
    if args.eval_limit is not None:
        command += ["--eval-limit", str(args.eval_limit)]
    if args.verbose:
        command.append("--verbose")
    return command


def launch_config(spec: JobSpec, shape: Topology):
    from torch.distributed.launcher.api import LaunchConfig

    if shape.nnodes == 1:  # torchrun --standalone: c10d on a free loopback port
        backend, endpoint, configs = "c10d", "localhost:0", {}
    else:  # static: node ranks are given, so each box keeps its ranks (and their RNG) across resumes
        backend, endpoint, configs = "static", shape.endpoint, {"rank": shape.node_rank}
    return LaunchConfig(
        min_nodes=shape.nnodes,
        max_nodes=shape.nnodes,
        nproc_per_node=shape.nproc_per_node,
        run_id=spec.name,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=configs,
        max_restarts=0,  # a dead rank ends the job; --resume continues from the last checkpoint
        start_method="spawn",
    )


def launch(args, spec: JobSpec, data_dir: Path) -> None:
    """Start this box's ranks and wait for them; LaunchError names the rank that failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    shape = topology(args, spec)
    share_cores(os.environ, shape.nproc_per_node)  # the ranks inherit this process's environment
    try:
        elastic_launch(launch_config(spec, shape), sys.executable)(*rank_command(args, data_dir))
    except ChildFailedError as error:
        ended = ", ".join(f"rank {rank} ({_how(failure.exitcode)})" for rank, failure in sorted(error.failures.items()))
        raise LaunchError(f"{ended} of '{spec.name}' failed, so the launcher ended the others") from None


def _how(exitcode: int) -> str:
    if exitcode < 0:
        import signal

        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"
