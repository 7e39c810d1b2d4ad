"""`appliance judge eval FILE.jsonl [--job JOB.yaml] [--scoring ...] [--mode ...] [--json]`: how good is the judge.

Runs the job's judge as training runs it (its endpoint; its weights and
quantization; with share_student_base the student's base loaded as the student
is) or, without --job, the bundled model with default settings, over labelled
rows and reports AUC, within-group pairwise accuracy (what GRPO uses: does the
judge rank a better answer to the same question above a worse one), accuracy
at --threshold, Spearman, failure rate,
latency p50/p95, tokens and, in group mode, the position bias (appliance/judge/harness.py),
then the injection guard's false-positive rate on the task's own gold answers
(the shipped GSM8K solutions without --job), with a warning above 0.5%. --mode and --scoring
take one value or a comma list (`--mode pointwise,group --scoring
probabilities,generate` runs every mode side by side on one loaded engine).
FILE `shipped` is the labelled set inside the package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from appliance.cli.main import EXIT_OK, add_data_dir, data_dir_of
from appliance.errors import ApplianceError, UsageError

MODES = ("pointwise", "group")
SCORINGS = ("auto", "probabilities", "reasoned", "generate")
DEFAULT_JUDGE_MODEL = "smollm2-135m-instruct"


def register(subparsers) -> None:
    parser = subparsers.add_parser("judge", help="judge tools: eval a judge on labelled rows")
    commands = parser.add_subparsers(dest="judge_command", metavar="COMMAND", required=True)
    evaluate = commands.add_parser("eval", help="AUC, accuracy, failure rate, latency and tokens of a judge")
    evaluate.add_argument("file", help="labelled JSONL (question, reference, response, label), or 'shipped'")
    evaluate.add_argument("--job", type=Path, default=None, help="job YAML whose judge section is evaluated")
    evaluate.add_argument("--mode", default=None, help="pointwise | group (or a comma list); default: the job's")
    evaluate.add_argument(
        "--scoring", default=None, help="auto | probabilities | reasoned | generate (or a comma list)"
    )
    evaluate.add_argument("--threshold", type=float, default=0.5, help="score at or above which a row counts as 1")
    evaluate.add_argument("--limit", type=int, default=None, help="the first N rows only")
    evaluate.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_data_dir(evaluate)
    evaluate.set_defaults(handler=_eval)


def _choices(value: str | None, allowed: tuple[str, ...], option: str, default: str) -> list[str]:
    values = [v.strip() for v in (value or default).split(",") if v.strip()]
    wrong = [v for v in values if v not in allowed]
    if wrong or not values:
        raise UsageError(f"{option}: {', '.join(wrong) or '(empty)'} is not one of {', '.join(allowed)}")
    return values


def _eval(args) -> int:
    from appliance.judge.harness import evaluate_judge, format_table, load_rows, shipped_set_path

    data_dir = data_dir_of(args)
    try:
        rows = load_rows(shipped_set_path() if args.file == "shipped" else Path(args.file))[: args.limit]
        spec, job = _judge_spec(args, data_dir)
        modes = _choices(args.mode, MODES, "--mode", spec.mode)
        scorings = _choices(args.scoring, SCORINGS, "--scoring", spec.scoring)
        if not 0.0 <= args.threshold <= 1.0:
            raise UsageError(f"--threshold must be between 0 and 1, got {args.threshold}")
        engine = _judge_engine(spec, job, data_dir)
    except ApplianceError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    from appliance.judge.judge import Judge

    reports = []
    try:
        for mode in modes:
            for scoring in scorings:
                variant = spec.model_copy(update={"mode": mode, "scoring": scoring})
                seed = job.grpo.seed if job is not None else 0
                reports.append(
                    evaluate_judge(
                        rows,
                        lambda log_path, v=variant: Judge(v, engine, log_path, seed=seed),
                        threshold=args.threshold,
                    )
                )
    except ApplianceError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    finally:
        engine.close()
    guard = _guard_on_gold(job)
    if args.json:
        print(
            json.dumps(
                {
                    "file": args.file,
                    "judge_model": spec.model,
                    "rows": len(rows),
                    "reports": [report.to_dict() for report in reports],
                    "guard_on_gold_answers": guard,
                },
                indent=2,
            )
        )
    else:
        print(f"judge {spec.model} on {len(rows)} rows of {args.file}")
        print(format_table(reports))
        if guard["total"]:
            print(
                f"injection guard on the gold answers of {guard['source']}: {guard['flagged']} of {guard['total']}"
                f" flagged ({guard['rate']:.2%})"
            )
    return EXIT_OK


def _guard_on_gold(job) -> dict:
    """The injection guard's false-positive rate on the task's own gold answers (the shipped GSM8K without a job),
    with a warning on stderr above GOLD_RATE_WARNING."""
    from appliance.judge.escape import DEFAULT_ESCAPER
    from appliance.judge.guard import GOLD_RATE_WARNING, gold_rate
    from appliance.judge.harness import gold_answers

    source, answers = gold_answers(job.task if job is not None else None)
    flagged, total = gold_rate(answers, DEFAULT_ESCAPER)
    rate = flagged / total if total else 0.0
    if rate > GOLD_RATE_WARNING:
        print(
            f"warning: the injection guard flags {flagged} of {total} gold answers of {source} ({rate:.2%}, above "
            f"{GOLD_RATE_WARNING:.1%}): it would give correct answers the lowest score; check them against the "
            "guard's lexicon (judge/guard.py) or set judge.injection_guard: off and rely on the differential check",
            file=sys.stderr,
        )
    return {"source": source, "flagged": flagged, "total": total, "rate": rate, "warning": rate > GOLD_RATE_WARNING}


def _judge_spec(args, data_dir: Path):
    """The job's judge section (paths made absolute), or the bundled model with default settings."""
    from appliance.job_checks import load_checked_job
    from appliance.config.schema import JudgeSpec

    if args.job is None:
        return JudgeSpec(model=DEFAULT_JUDGE_MODEL), None
    job = load_checked_job(args.job, data_dir)
    if job.judge is None:
        raise UsageError(f"--job {args.job}: the job has no 'judge' section to evaluate")
    return job.judge, job


def _judge_engine(spec, job, data_dir: Path):
    """The judge engine as the job trains with it: its endpoint, its weights and quantization, or the
    student's base weights loaded as the student is (quantization included) when it shares them."""
    from appliance.models.causal_lm import default_device
    from appliance.models.store import resolve_model

    if spec.endpoint is not None:
        from appliance.engines.openai_remote import OpenAIRemoteEngine

        return OpenAIRemoteEngine.from_judge_spec(spec)
    shared = job is not None and spec.share_student_base
    model_dir = resolve_model(job.student.model if shared else spec.model, data_dir)
    device = default_device()
    kind = job.engine.judge if job is not None else "auto"
    if not shared and (kind == "vllm" or (kind == "auto" and device.startswith("cuda"))):
        from appliance.engines.vllm_args import VllmSettings
        from appliance.engines.vllm_engine import VLLMEngine

        if job is not None:
            return VLLMEngine.for_judge(job, model_dir, kv_cache_bytes=1 << 30, device=device)
        settings = VllmSettings(
            model_dir, model_name=f"{spec.model}-judge", kv_cache_bytes=1 << 30, device=device, enable_lora=False
        )
        return VLLMEngine(settings)
    from appliance.engines.hf import HFEngine

    # Training's shared judge is the student's model with its adapter off: loaded as the student is.
    quantization = job.student.quantization if shared else spec.quantization
    name = f"{job.student.model} (base)" if shared else spec.model
    return HFEngine.load(model_dir, quantization, device=device, name=name)
