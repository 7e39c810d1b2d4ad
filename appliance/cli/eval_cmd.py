"""`appliance eval FILE [--adapter DIR] [--data JSONL] [--limit N] [--temperature T --samples K] [--json]`.

Held-out accuracy of a policy (agent jobs: success over held-out scenarios of
the job's environment). Without --adapter the base model is evaluated (the
adapter disabled). --adapter takes a checkpoint folder (checkpoints/step-NNNNNN),
its adapter/ folder, or best/. Without --data the job's held-out problems are
used. Greedy unless the job's checkpoint.eval_temperature / eval_samples or
--temperature / --samples say to sample (then the shares are over all draws,
from the job's seed, so two adapters are compared on the same draws).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_OK, add_data_dir, data_dir_of
from appliance.errors import ApplianceError, UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="held-out accuracy (agent jobs: success) and mean rewards")
    parser.add_argument("file", type=Path, help="job YAML file (model, task, rewards)")
    parser.add_argument("--adapter", type=Path, default=None, help="checkpoint, adapter or best/ folder")
    parser.add_argument("--data", type=Path, default=None, help="JSONL with question/answer rows (default: held-out)")
    parser.add_argument(
        "--limit", type=int, default=None, help="evaluate the first N problems (agent jobs: scenarios) only"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sample at this temperature (default: the job's checkpoint.eval_temperature; 0 greedy)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help="draws per problem or scenario (default: the job's checkpoint.eval_samples)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_data_dir(parser)
    parser.set_defaults(handler=_eval)


def adapter_folder(path: Path) -> Path:
    """Accept a checkpoint folder, its adapter/ folder, or best/."""
    for candidate in (path, path / "adapter"):
        if (candidate / "adapter_model.safetensors").is_file():
            return candidate
    raise UsageError(
        f"--adapter {path} holds no adapter_model.safetensors (give a checkpoint, adapter or best/ folder)"
    )


def _eval(args) -> int:
    from appliance.job_checks import load_checked_job
    from appliance.conventions import JUDGE_REWARD
    from appliance.grpo.evaluate import evaluate_student
    from appliance.grpo.student import Student
    from appliance.models.causal_lm import default_device
    from appliance.models.store import resolve_model
    from appliance.rewards.registry import build_rewards
    from appliance.tasks.jsonl import load_jsonl_problems
    from appliance.tasks.load import load_task

    data_dir = data_dir_of(args)
    try:
        spec = load_checked_job(args.file, data_dir)
        how = _sampling(args, spec)
    except ApplianceError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    if spec.task.environment is not None:
        return _eval_agent(args, spec, data_dir, how)
    try:
        task = load_task(spec.task, args.file.resolve().parent)
        problems = load_jsonl_problems(args.data) if args.data else task.held_out
        adapter = adapter_folder(args.adapter) if args.adapter else None
        student = Student(spec.student, resolve_model(spec.student.model, data_dir), default_device())
        if adapter:
            student.load_adapter(adapter)
    except ApplianceError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    problems = [p for p in problems if p.answer is not None][: args.limit]  # no reference: no accuracy
    # The judge is left out: evaluation loads no judge model, and accuracy comes from the references.
    rewards = build_rewards([r for r in spec.rewards if r.name != JUDGE_REWARD], args.file.resolve().parent)
    result = evaluate_student(
        student, task, problems, rewards, spec.grpo.max_new_tokens, use_adapter=adapter is not None, how=how
    )
    return _report(args, spec, adapter, result, "problems", "accuracy")


def _sampling(args, spec):
    """How to draw: --temperature / --samples over the job's checkpoint.eval_temperature / eval_samples."""
    from appliance.grpo.evaluate import EvalSampling

    temperature = spec.checkpoint.eval_temperature if args.temperature is None else args.temperature
    samples = spec.checkpoint.eval_samples if args.samples is None else args.samples
    try:
        return EvalSampling(temperature, samples, spec.grpo.seed)
    except ValueError as error:  # EvalSampling's own check, worded here with the flags that set it
        raise UsageError(
            f"--temperature {temperature:g} with --samples {samples} (or the job's checkpoint.eval_temperature"
            f" / eval_samples): {error}"
        ) from None


def _eval_agent(args, spec, data_dir: Path, how) -> int:
    """Success of whole episodes on held-out scenarios of the job's in-process environment."""
    from appliance.agents.trajectory_sources import build_environment
    from appliance.grpo.evaluate import AGENT_EVAL_SCENARIOS, evaluate_agent_student
    from appliance.grpo.student import Student
    from appliance.models.causal_lm import default_device
    from appliance.models.store import resolve_model

    if args.data:
        print(
            f"error: --data: {args.file} is an agent job (task.environment {spec.task.environment}); its held-out "
            "scenarios come from the environment; drop --data",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        environment = build_environment(spec, data_dir)
        adapter = adapter_folder(args.adapter) if args.adapter else None
        student = Student(spec.student, resolve_model(spec.student.model, data_dir), default_device())
        if adapter:
            student.load_adapter(adapter)
    except ApplianceError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    scenarios = args.limit or spec.checkpoint.eval_limit or AGENT_EVAL_SCENARIOS
    result = evaluate_agent_student(
        student, environment, scenarios, spec.grpo.max_new_tokens, use_adapter=adapter is not None, how=how
    )
    return _report(args, spec, adapter, result, "scenarios", "success")


def _report(args, spec, adapter: Path | None, result, unit: str, measure: str) -> int:
    from appliance.cli.train_cmd import sampled_note

    report = {"job": spec.name, "adapter": str(adapter) if adapter else None, **result.to_dict()}
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(
        f"{spec.name} ({'adapter ' + str(adapter) if adapter else 'base model'}) on {result.problems} {unit}"
        f"{sampled_note(result.temperature, result.samples)}: {measure} {result.accuracy:.1%}, "
        f"format compliance {result.format_compliance:.1%}, {result.seconds:.1f} s"
    )
    for name, value in result.reward_means.items():
        print(f"  {name:<16} {value:.3f}")
    return EXIT_OK
