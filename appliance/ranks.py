"""How a job's processes are started and share a box: the one launcher of a job's ranks, which devices the
student's ranks and the judge each see, and the CPU threads each rank may use.

`appliance train` and the daemon's worker both start ranks through `launch_ranks`, over torch's elastic launcher:
the rendezvous port is the launcher's to choose, its environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_PORT) the
launcher's to write. Imports nothing heavy: the daemon reads it to place a job without loading torch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import ApplianceError

# Where the NVIDIA driver lists the box's GPUs: the hardware boundary that tests replace with a folder of their own.
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


class PlacementError(ApplianceError):
    """The box does not have the devices a job's placement asks for; the message says how many (a bad job here:
    `appliance train` refuses it in one line, exit 2)."""


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


# ----- the launcher -----------------------------------------------------------------------------------------


class LaunchError(ApplianceError):
    """The ranks cannot be started as asked, or one of them failed; the message says which and how."""

    def __init__(self, message: str, exit_codes: dict[int, int] | None = None):
        super().__init__(message)
        self.exit_codes = exit_codes or {}  # rank -> exit code of the ranks that failed


@dataclass(frozen=True)
class Topology:
    """One box's part of a job: boxes in all, this box's rank (None: the only box), the rendezvous, its ranks."""

    nnodes: int
    node_rank: int | None
    endpoint: str | None
    nproc_per_node: int


def launch_ranks(name: str, shape: Topology, entrypoint: Callable[..., None], args: tuple, logs: Path) -> None:
    """Start this box's ranks of job `name`, each running `entrypoint(*args)`, and wait for them all.

    The ranks are forked from this process, so they stay in its process group (ending the group ends the job)
    and inherit what it holds (the daemon's report channel). A rank that fails ends the others; LaunchError
    then names it and how it ended. `entrypoint` raises SystemExit(code) to fail. `logs`: the folder, beside
    the job's, where torch's launcher keeps the ranks' error files while they run.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    # Left to itself the launcher makes a /tmp folder per launch and never removes it; a launcher killed with
    # SIGKILL (the daemon's cancel) cannot remove one either. This one is the job's, replaced at each launch.
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    try:
        _launch(name, shape, entrypoint, args, DefaultLogsSpecs(log_dir=str(logs)))
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def launch_logs(job_dir: Path, node_rank: int | None = None) -> Path:
    """Where this box's launcher of the job in `job_dir` keeps the ranks' error files: beside the job's folder
    (whose contents say whether a run exists), one per box (boxes may share a data dir)."""
    return job_dir.parent / f".{job_dir.name}.node{node_rank or 0}.launch"


def _launch(name: str, shape: Topology, entrypoint: Callable[..., None], args: tuple, logs_specs) -> None:
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if shape.nnodes == 1:  # torchrun --standalone: c10d on a loopback port the store binds and reports
        backend, endpoint, configs = "c10d", "localhost:0", {}
    else:  # static: node ranks are given, so each box keeps its ranks (and their RNG) across resumes
        backend, endpoint, configs = "static", shape.endpoint, {"rank": shape.node_rank}
    config = LaunchConfig(
        min_nodes=shape.nnodes,
        max_nodes=shape.nnodes,
        nproc_per_node=shape.nproc_per_node,
        run_id=name,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=configs,
        logs_specs=logs_specs,
        max_restarts=0,  # a dead rank ends the job; a resume continues from the last checkpoint
        # Forked, not spawned: a forked rank ends with os._exit, skipping the interpreter's finalization, where
        # gloo's threads can abort a finished rank (SIGABRT in a C++ destructor).
        start_method="fork",
    )
    share_cores(os.environ, shape.nproc_per_node)  # the ranks inherit this process's environment
    try:
        elastic_launch(config, entrypoint)(*args)
    except (DistError, RendezvousError) as error:  # before any rank: the port taken, node 0 not reachable
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LaunchError(
            f"the rendezvous of '{name}' at {endpoint} failed ({reason}); check that --rdzv-endpoint names node 0's "
            "address and a port free there"
        ) from None
    except ChildFailedError as error:
        ended = ", ".join(f"rank {rank} ({_how(failure.exitcode)})" for rank, failure in sorted(error.failures.items()))
        codes = {rank: failure.exitcode for rank, failure in error.failures.items()}
        raise LaunchError(f"{ended} of '{name}' failed, so the launcher ended the others", codes) from None


def _how(exitcode: int) -> str:
    if exitcode < 0:
        import signal

        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"
