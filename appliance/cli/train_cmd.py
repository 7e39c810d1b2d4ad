"""`appliance train FILE [--data-dir DIR] [--resume | --restart] [--eval]`: the training loop in the foreground."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, add_data_dir, data_dir_of
from appliance.metrics.server import parse_metrics_addr


def register(subparsers) -> None:
    parser = subparsers.add_parser("train", help="run a GRPO job in the foreground (no daemon)")
    parser.add_argument("file", type=Path, help="job YAML file")
    add_data_dir(parser)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    group.add_argument("--restart", action="store_true", help="archive an earlier run of this job and start over")
    parser.add_argument("--eval", action="store_true",
                        help="measure held-out accuracy of the base model before and of the trained adapter after")
    parser.add_argument("--eval-limit", type=int, default=None, help="held-out problems to evaluate (default: all)")
    parser.add_argument("--metrics-addr", default=None, metavar="HOST:PORT",
                        help="serve Prometheus metrics of this run here (e.g. 127.0.0.1:9464)")
    parser.set_defaults(handler=_train)


def format_progress(record: dict, steps: int) -> str:
    rewards = "  ".join(f"{name} {stats['mean']:.2f}" for name, stats in record["rewards"].items() if name != "total")
    seconds = record["seconds"]
    return (f"step {record['step']:>4}/{steps}  reward {record['reward_mean']:+.3f} ±{record['reward_std']:.2f}  "
            f"[{rewards}]  loss {record['loss']:+.4f}  groups {record['groups_informative']}/{record['groups_total']}  "
            f"{record['tokens_per_second']:.0f} tok/s  {seconds['step']:.1f} s")


def _train(args) -> int:
    from appliance.config.checks import load_checked_job
    from appliance.config.load import JobFileError
    from appliance.grpo.job import JobSetupError, build_trainer, prepare_job_dir
    from appliance.models.store import ModelStoreError
    from appliance.tasks.base import TaskError

    data_dir = data_dir_of(args)
    exporter = None
    try:
        metrics_address = parse_metrics_addr(args.metrics_addr) if args.metrics_addr else None
        spec = load_checked_job(args.file, data_dir)
        job_dir = prepare_job_dir(data_dir, spec, resume=args.resume, restart=args.restart)
        trainer = build_trainer(spec, args.file.resolve().parent, data_dir, job_dir)
    except (JobFileError, JobSetupError, ModelStoreError, TaskError, ValueError) as error:
        print("\n".join(f"error: {line}" for line in str(error).splitlines()), file=sys.stderr)
        return EXIT_BAD_INPUT
    if metrics_address:
        exporter = RunExporter(trainer, data_dir, *metrics_address)
        print(f"Prometheus metrics on {exporter.server.url}", flush=True)

    def progress(record: dict) -> None:
        print(format_progress(record, spec.grpo.steps), flush=True)
        if exporter:
            exporter.observe(record)

    trainer.progress = progress
    if args.resume:
        step = trainer.resume()
        print(f"resumed '{spec.name}' at step {step}" if step else f"no checkpoint in {job_dir}; starting at step 0")
    print(f"job '{spec.name}' in {job_dir}: {spec.grpo.steps} steps, micro-batch {trainer.micro_batch_size}, "
          f"gradient checkpointing {'on' if trainer.choices.gradient_checkpointing else 'off'}, "
          f"rollouts on {trainer.choices.rollout_weights} weights", flush=True)
    summary: dict = {"job_dir": str(job_dir)}
    held_out = trainer.task.held_out[: args.eval_limit] if args.eval_limit else trainer.task.held_out
    if args.eval and trainer.step == 0:
        summary["before"] = _evaluate(trainer, held_out, adapter=False)
        print(f"held-out before: accuracy {summary['before']['accuracy']:.1%}, "
              f"format {summary['before']['format_compliance']:.1%} on {len(held_out)} problems", flush=True)
    try:
        trainer.run()
    except Exception as error:  # the last complete checkpoint stays; say how to continue
        print(f"error: training stopped at step {trainer.step + 1}: {type(error).__name__}: {error}; "
              f"'appliance train {args.file} --resume' continues from the last checkpoint", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if exporter:
            exporter.close()
    if args.eval:
        summary["after"] = _evaluate(trainer, held_out, adapter=True)
        print(f"held-out after:  accuracy {summary['after']['accuracy']:.1%}, "
              f"format {summary['after']['format_compliance']:.1%} on {len(held_out)} problems", flush=True)
        (job_dir / "eval.json").write_text(json.dumps(summary, indent=2))
    print(f"done: checkpoints in {job_dir / 'checkpoints'}, best adapter in {job_dir / 'best'}")
    return EXIT_OK


class RunExporter:
    """Prometheus metrics of a foreground run, fed from each step's record."""

    def __init__(self, trainer, data_dir: Path, host: str, port: int):
        from appliance import __version__
        from appliance.metrics import TrainingMetrics, serve_metrics

        spec = trainer.spec
        self.trainer, self.data_dir = trainer, data_dir
        self.metrics = TrainingMetrics(version=__version__, student_model=spec.student.model,
                                       judge_model=spec.judge.model if spec.judge else None)
        if trainer.plan is not None:
            self.metrics.observe_plan(trainer.plan)
            self.metrics.observe_device(trainer.plan.device)
        self.metrics.observe_disk(data_dir)
        self.server = serve_metrics(self.metrics, host, port)

    def observe(self, record: dict) -> None:
        trainer, metrics = self.trainer, self.metrics
        metrics.observe_step(record)
        if trainer.ledger is not None:
            metrics.observe_ledger(trainer.ledger)
        if trainer.judge is not None:
            metrics.observe_judge(trainer.judge.stats(), trainer.judge.outcomes)
        for engine in (trainer.engine, getattr(trainer.judge, "engine", None)):
            if hasattr(engine, "metrics_snapshot"):
                metrics.add_engine_snapshot(engine.metrics_snapshot())
        metrics.observe_disk(self.data_dir)

    def close(self) -> None:
        self.server.close()


def _evaluate(trainer, problems, adapter: bool) -> dict:
    from appliance.grpo.evaluate import evaluate_student

    return evaluate_student(trainer.student, trainer.task, problems, trainer.rewards_for_eval(),
                            trainer.spec.grpo.max_new_tokens, use_adapter=adapter).to_dict()
