"""`appliance train` for a job of several ranks: the shape of this box's launch, from the flags or Slurm.

One launcher per box (node) starts `resources` student ranks through ranks.launch_ranks (torch's elastic
launcher, the daemon's too); each rank runs the job as cli/train_cmd.train does. One box: a c10d rendezvous on
a loopback port. Several boxes: --nnodes / --node-rank / --rdzv-endpoint, or the variables Slurm sets
(SLURM_NNODES, SLURM_NODEID, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import os

from appliance.config.schema import JobSpec
from appliance.ranks import LaunchError, Topology


def add_launch_arguments(parser) -> None:
    parser.add_argument("--nnodes", type=int, default=None, help="boxes in the job (default: resources.nodes)")
    parser.add_argument("--node-rank", type=int, default=None, help="this box's rank, 0 .. nnodes-1")
    parser.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="the rendezvous of a several-box job (node rank 0's address on the lab network)",
    )


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
