"""`appliance train FILE [--data-dir DIR] [--resume | --restart] [--eval]`: run_job in the foreground.

The terminal shows one line per step (and a progress bar with the ETA when
stdout is a terminal); library chatter (weight-loading bars, warnings of
transformers, bitsandbytes, vLLM) goes to the job's log.txt unless --verbose.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from appliance import __version__
from appliance.cli.main import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, add_data_dir, data_dir_of
from appliance.cli.terminal import Terminal
from appliance.job_checks import load_checked_job
from appliance.errors import ApplianceError
from appliance.paths import jobs_dir


def register(subparsers) -> None:
    parser = subparsers.add_parser("train", help="run a GRPO job in the foreground (no daemon)")
    parser.add_argument("file", type=Path, help="job YAML file")
    add_data_dir(parser)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    group.add_argument("--restart", action="store_true", help="archive an earlier run of this job and start over")
    parser.add_argument(
        "--eval",
        action="store_true",
        help="measure held-out accuracy of the base model before and of the trained adapter after",
    )
    parser.add_argument(
        "--eval-limit",
        type=int,
        default=None,
        help="held-out problems (agent jobs: scenarios) to evaluate (default: checkpoint.eval_limit,"
        " else all; 32 scenarios for an agent job)",
    )
    parser.add_argument(
        "--metrics-addr",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics of this run here (e.g. 127.0.0.1:9464)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show the libraries' own output (weight loading, warnings) in the terminal",
    )
    from appliance.cli.launch import add_launch_arguments

    add_launch_arguments(parser)
    parser.set_defaults(handler=train)


def format_progress(record) -> str:
    """One terminal line for a StepRecord."""
    rewards = "  ".join(f"{name} {stats.mean:.2f}" for name, stats in record.rewards.items() if name != "total")
    line = (
        f"step {record.step:>4}/{record.steps_total}  reward {record.reward_mean:+.3f} ±{record.reward_std:.2f}  "
        f"[{rewards}]  loss {record.loss:+.4f}  groups {record.groups_informative}/{record.groups_total}  "
        f"{record.student_tokens_per_second:.0f} tok/s  {record.seconds['step']:.1f} s"
    )
    if record.nonfinite:
        line += "  (non-finite: update skipped)"
    if record.eval is not None:
        line += f"  held-out {record.eval.accuracy:.1%}"
    return line


def sampled_note(temperature: float, samples: int) -> str:
    """How an evaluation drew, for its one-line summary: nothing when greedy."""
    if temperature == 0.0:
        return ""
    return f" ({samples} sample{'s' if samples > 1 else ''} each at temperature {temperature:g})"


def train(args) -> int:
    """The job in the foreground: the launcher of its ranks, one rank of it, or the whole job in this process."""
    data_dir = data_dir_of(args)
    try:
        # The training stack (torch, transformers, the listener's uvicorn) loads only when a job runs, not for
        # `appliance --help` on a client-only install.
        from appliance.grpo.distributed import LAUNCHER, process_role
        from appliance.metrics.scrape_server import parse_metrics_addr

        metrics_address = parse_metrics_addr(args.metrics_addr) if args.metrics_addr else None
        spec = load_checked_job(args.file, data_dir)

        # Flags for several boxes make this box's launcher (topology() holds them to the job); --nnodes 1 does not:
        # its one rank, forked with the same flags, would launch again.
        several = (args.nnodes or 1) > 1 or bool(args.node_rank)
        world = process_role(spec.resources, several=several)
        if world == LAUNCHER:
            return _launch(args, spec, data_dir)
        if world.world_size == 1:  # the whole job here: no other run of it may share its folder
            run_lock = hold_job_name(data_dir, spec.name)  # noqa: F841 - held until this run returns
        job_dir = _job_dir(args, spec, data_dir, world)
    except ApplianceError as error:
        return _refused(error, error.exit_code)
    from appliance.grpo.run import run_job

    progress = Progress(job_dir, spec, world, args.verbose, metrics_address, data_dir)
    code = EXIT_OK
    try:
        with progress.terminal:
            run_job(
                spec,
                data_dir,
                job_dir,
                job_file_dir=args.file.resolve().parent,
                world=world,
                resume=args.resume,
                evaluate=args.eval,
                eval_limit=args.eval_limit,
                on_step=progress.on_step,
                on_event=progress.on_event,
            )
        if world.is_main and world.world_size == 1:  # a rank's launcher reports the job's end
            print(f"done: checkpoints in {job_dir / 'checkpoints'}, best adapter in {job_dir / 'best'}")
    except ApplianceError as error:  # the same kind can be input to correct or, once steps ran, a failed run
        code = _refused(error, error.exit_code if progress.terminal.steps_seen == 0 else EXIT_FAILURE)
    except Exception as error:  # the last complete checkpoint stays; say how to continue
        code = _crashed(error, args.file, job_dir, progress.terminal.last_step)
    finally:
        progress.close()
    if world.world_size > 1:
        from appliance.grpo.distributed import destroy_process_group

        destroy_process_group()
    return code


def hold_job_name(data_dir: Path, name: str):
    """The open lock file that makes this process the one run of job `name` in the data dir, held until it exits.

    Two runs of one job (a second `appliance train --resume` while the first still runs) would write the same
    checkpoints and records. The lock sits beside the job's folder, which --restart renames; the forked ranks
    inherit it, so it is held until the last of them ends.
    """
    import fcntl

    folder = jobs_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / f".{name}.lock", "a")  # noqa: SIM115 - held for the life of the run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ApplianceError(
            f"job '{name}' is already running from {folder / name} (another 'appliance train' holds it); wait for "
            "it to end or stop it, or give this job another name"
        ) from None
    return handle


def train_rank(args) -> None:
    """One rank of a several-rank `appliance train`, forked by ranks.launch_ranks: the same run, as that rank."""
    code = train(args)
    if code:
        raise SystemExit(code)  # the launcher ends the other ranks and reports this one


def _job_dir(args, spec, data_dir: Path, world) -> Path:
    """The job folder: made, archived (--restart) or checked for a resume; a rank joins the folder its launcher
    prepared, and the job's process group."""
    from appliance.grpo.checkpoint import check_world_size
    from appliance.grpo.distributed import init_process_group
    from appliance.grpo.run import prepare_job_dir

    if world.world_size > 1:
        job_dir = jobs_dir(data_dir) / spec.name
        job_dir.mkdir(parents=True, exist_ok=True)
        init_process_group(world)
        return job_dir
    job_dir = prepare_job_dir(data_dir, spec, resume=args.resume, restart=args.restart)
    if args.resume:
        check_world_size(job_dir, 1)
    return job_dir


def _refused(error: Exception, exit_code: int) -> int:
    print("\n".join(f"error: {line}" for line in str(error).splitlines()), file=sys.stderr)
    return exit_code


def _crashed(error: Exception, job_file: Path, job_dir: Path, last_step: int | None) -> int:
    with open(job_dir / "log.txt", "a", encoding="utf-8") as log:
        traceback.print_exc(file=log)
    print(
        f"error: training stopped after step {last_step}: {type(error).__name__}: {error}; "
        f"'appliance train {job_file} --resume' continues from the last checkpoint "
        f"(details in {job_dir / 'log.txt'})",
        file=sys.stderr,
    )
    return EXIT_FAILURE


class Progress:
    """What a run shows: one terminal line per step and the evaluations (rank 0 only), and the metrics port."""

    def __init__(self, job_dir: Path, spec, world, verbose: bool, metrics_address, data_dir: Path):
        self.main_rank = world.is_main
        log_name = "log.txt" if self.main_rank else f"log.rank{world.rank}.txt"
        self.terminal = Terminal(job_dir / log_name, verbose=verbose, steps=spec.grpo.steps)
        self.exporter = None
        if metrics_address:
            from appliance.metrics.run_exporter import RunExporter

            judge_model = spec.judge.model if spec.judge else None
            self.exporter = RunExporter(
                data_dir,
                *metrics_address,
                version=__version__,
                student_model=spec.student.model,
                judge_model=judge_model,
            )
            print(f"Prometheus metrics on {self.exporter.server.url}", flush=True)

    def on_step(self, record) -> None:
        if self.main_rank:
            self.terminal.step(format_progress(record), record.step)
        if self.exporter:
            self.exporter.on_step(record)

    def on_event(self, event) -> None:
        if self.main_rank and event.kind == "log":
            self.terminal.line(event.data["line"])
        elif self.main_rank and event.kind == "eval" and event.data.get("when") in ("before", "after"):
            self.terminal.line(
                f"held-out {event.data['when']}: accuracy {event.data['accuracy']:.1%}, "
                f"format {event.data['format_compliance']:.1%} on {event.data['problems']} problems"
                + sampled_note(event.data.get("temperature", 0.0), event.data.get("samples", 1))
            )
        if self.exporter and self.main_rank:
            self.exporter.on_event(event)

    def close(self) -> None:
        if self.exporter:
            self.exporter.close()


def _launch(args, spec, data_dir: Path) -> int:
    """This box's launcher: prepare the job folder (node 0), start the ranks, report how they ended."""
    from appliance.cli.launch import topology
    from appliance.grpo.run import prepare_job_dir
    from appliance.ranks import LaunchError, launch_logs, launch_ranks

    try:
        shape = topology(args, spec)
        if not shape.node_rank:
            run_lock = hold_job_name(data_dir, spec.name)  # noqa: F841 - held while the ranks run
            job_dir = prepare_job_dir(data_dir, spec, resume=args.resume, restart=args.restart)
    except ApplianceError as error:
        return _refused(error, error.exit_code)
    print(
        f"starting {shape.nproc_per_node} rank(s) on this box"
        + (f" (node {shape.node_rank} of {shape.nnodes})" if shape.nnodes > 1 else ""),
        flush=True,
    )
    try:
        logs = launch_logs(jobs_dir(data_dir) / spec.name, shape.node_rank)
        launch_ranks(spec.name, shape, train_rank, (args,), logs)
    except LaunchError as error:
        if EXIT_BAD_INPUT in error.exit_codes.values():  # the ranks refused the job: a resume would refuse it too
            print(f"error: {error}; change the job as the rank said", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(
            f"error: {error}; 'appliance train {args.file} --resume' continues from the last checkpoint",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    if not shape.node_rank:
        print(f"done: checkpoints in {job_dir / 'checkpoints'}, best adapter in {job_dir / 'best'}")
    return EXIT_OK
