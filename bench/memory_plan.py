"""Plan vs measured memory on the CPU with the bundled model: the budget manager's calibration check.

Runs, in this process, what one GRPO step does to memory with SmolLM2-135M-
Instruct as a 4-bit (nf4) student with LoRA r16 on q/k/v/o: generate 32
completions of 24 tokens after 48-token prompts, optionally judge each with
the same model unquantized (--judge), then one forward+backward+AdamW step on
all 32 sequences of 72 tokens in one micro-batch (--sequences changes the 32). It records the peak RSS of
each phase (VmHWM, reset between phases) and of the whole run (ru_maxrss),
and prints them next to `plan_job`'s plan for the same workload.

    python bench/memory_plan.py [--data-dir DIR] [--judge] [--gradient-checkpointing] [--sequences N] [--json]
    python bench/memory_plan.py --job examples/multiply.yaml [--steps 2] [--data-dir DIR]

With --job, the real trainer runs the job's first steps (grpo.run_job, in a
temporary data dir that sees the model store) and the plan it made from the
job's measured prompts is compared with the process's peak RSS.

The done-criterion of the budget manager is the whole-run peak within +-15% of
the plan's peak.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (must precede every ML import)

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from appliance.budget.device_probe import process_rss_bytes, probe_device
from appliance.budget.plan import plan_job
from appliance.config.job_file import parse_job_text
from appliance.config.sizes import format_bytes
from scratch_data import link_model_store

PROMPT_TOKENS, NEW_TOKENS, JUDGE_NEW_TOKENS, GROUP_SIZE = 48, 24, 8, 8
VmHWM = "VmHWM"


def job_text(judge: bool, checkpointing: bool, sequences: int) -> str:
    judge_section = (
        "judge: {model: smollm2-135m-instruct, quantization: none, mode: pointwise, "
        f"max_new_tokens: {JUDGE_NEW_TOKENS}}}\n"
        if judge
        else ""
    )
    rewards = "[{name: correctness}, {name: judge}]" if judge else "[{name: correctness}]"
    return (
        "name: memory-bench\n"
        "student: {model: smollm2-135m-instruct, quantization: nf4, compute_dtype: float32, "
        f"gradient_checkpointing: {str(checkpointing).lower()}, "
        "lora: {rank: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj]}}\n"
        + judge_section
        + f"rewards: {rewards}\n"
        f"grpo: {{group_size: {GROUP_SIZE}, prompts_per_step: {sequences // GROUP_SIZE}, max_new_tokens: {NEW_TOKENS}, "
        f"max_prompt_tokens: {PROMPT_TOKENS}, micro_batch_size: {sequences}}}\n"
        "engine: {rollout: hf, judge: hf, rollout_weights: shared}\n"
        "device: {memory_budget: 100%}\n"
    )


def high_water_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(VmHWM + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_high_water() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


def keep_4bit_weights_trainable(model) -> None:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference on the first eval forward.

    After that repacking (bitsandbytes 0.50, CPUs with AVX512-BF16) training runs
    through `gemv_4bit`, which has no autograd kernel: gradients through frozen
    4-bit layers are silently dropped (the layer-0 LoRA gradient changes by 100%).
    The trainer must do the same; measuring without it would calibrate a wrong run.
    """
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def run(data_dir: Path, judge: bool, checkpointing: bool, sequences: int = 32) -> dict:
    from appliance.budget.host_allocator import pin_mmap_threshold

    pin_mmap_threshold()  # as the trainer does (grpo.job.build_trainer)
    job = parse_job_text(job_text(judge, checkpointing, sequences), "<bench>")
    measured: dict[str, int] = {}
    started = time.monotonic()

    import torch
    import transformers  # noqa: F401
    import peft  # noqa: F401
    import bitsandbytes  # noqa: F401
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from appliance.models.store import resolve_model

    measured["libraries"] = process_rss_bytes()
    model_dir = resolve_model("smollm2-135m-instruct", data_dir, verify=False)
    config = json.loads((model_dir / "config.json").read_text())
    plan = plan_job(job, config, config if judge else None, probe_device("cpu"))

    torch.manual_seed(0)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    student = AutoModelForCausalLM.from_pretrained(
        str(model_dir), quantization_config=quantization, dtype=torch.float32, device_map="cpu"
    )
    keep_4bit_weights_trainable(student)
    student = get_peft_model(
        student,
        LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    judge_model = None
    if judge:
        judge_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, device_map="cpu")
    measured["loaded"] = process_rss_bytes()

    prompts = torch.randint(100, 40000, (sequences, PROMPT_TOKENS))
    reset_high_water()
    with torch.no_grad():
        completed = student.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=2,
        )
    measured["generate"] = high_water_bytes()

    if judge_model is not None:
        reset_high_water()
        with torch.no_grad():
            judge_model.generate(
                input_ids=completed,
                attention_mask=torch.ones_like(completed),
                do_sample=False,
                max_new_tokens=JUDGE_NEW_TOKENS,
                min_new_tokens=JUDGE_NEW_TOKENS,
                pad_token_id=2,
            )
        measured["judge"] = high_water_bytes()

    reset_high_water()
    student.train()
    if checkpointing:
        student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        student.enable_input_require_grads()
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-5)
    advantages = torch.randn(sequences, 1)
    # Logits for the completion only (plus the position that predicts its first token), as a GRPO trainer does.
    logits = student(input_ids=completed, logits_to_keep=NEW_TOKENS + 1).logits[:, :-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, completed[:, PROMPT_TOKENS:, None]).squeeze(-1)
    loss = -(logprobs * advantages).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    measured["train"] = high_water_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    phases = {
        name: {"planned_bytes": phase.peak_bytes, "measured_bytes": measured.get(name)}
        for name, phase in plan.phases.items()
    }
    return {
        "workload": {
            "sequences": sequences,
            "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": NEW_TOKENS,
            "judge": judge,
            "gradient_checkpointing": checkpointing,
        },
        "plan": plan.to_dict(),
        "measured_bytes": measured,
        "phases": phases,
        "planned_peak_bytes": plan.peak_bytes,
        "measured_peak_bytes": peak,
        "ratio": peak / plan.peak_bytes,
        "seconds": time.monotonic() - started,
    }


def plan_of_trained_batch(
    spec, data_dir: Path, job_file: Path, trained: int, choices: dict, completion_tokens: int | None = None
) -> int:
    """The plan's peak for the batch that really trained: `trained` sequences in one micro-batch.

    The trainer drops groups whose rewards are all equal, so a step trains from
    0 to all of its sequences; the plan budgets for all of them. It also budgets
    every completion at max_new_tokens, while a batch is as wide as its longest
    completion. Re-planning the job with the prompts that trained and, given
    `completion_tokens`, that longest completion (the other choices pinned to
    the run's) compares the memory model with what ran.
    """
    from appliance.budget.plan import plan_job
    from appliance.budget.device_probe import probe_device
    from appliance.budget.shapes import load_config
    from appliance.grpo.prompt_lengths import measure_prompt_tokens
    from appliance.models.store import resolve_model

    group = spec.grpo.group_size
    prompts = max(1, -(-trained // group))
    replanned = spec.model_copy(
        update={
            "grpo": spec.grpo.model_copy(
                update={
                    "prompts_per_step": prompts,
                    "micro_batch_size": prompts * group,
                    "max_new_tokens": completion_tokens or spec.grpo.max_new_tokens,
                }
            ),
            "student": spec.student.model_copy(update={"gradient_checkpointing": choices["gradient_checkpointing"]}),
            "engine": spec.engine.model_copy(update={"rollout_weights": choices["rollout_weights"]}),
        }
    )
    student_dir = resolve_model(spec.student.model, data_dir, verify=False)
    judge_dir = (
        resolve_model(spec.judge.model, data_dir, verify=False) if spec.judge and not spec.judge.endpoint else None
    )
    plan = plan_job(
        replanned,
        load_config(student_dir / "config.json"),
        load_config(judge_dir / "config.json") if judge_dir else None,
        probe_device("cpu"),
        prompt_tokens=measure_prompt_tokens(spec, student_dir, job_file.resolve().parent),
    )
    return plan.peak_bytes


NOISE_REWARD = Path(__file__).resolve().parent / "noise_reward.py"
PLUGINS = Path(__file__).resolve().parent / "plugins"


def with_longest_prompts(spec, data_dir: Path, job_file: Path, scratch: Path, count: int):
    """`spec` training on only its `count` longest training prompts (chat template included), held_out 0.

    The plan budgets the longest prompt of the whole dataset; a step's batch is only as wide as the prompts
    it drew. gsm8k's training prompts run from 55 to 266 tokens (median 99), so a step on random prompts measures a batch
    far narrower than the one planned. The problems go to a scratch JSONL dataset in the same order.
    """
    from appliance.grpo.prompt_lengths import prompt_tokens
    from appliance.models.causal_lm import load_tokenizer
    from appliance.models.store import resolve_model
    from appliance.tasks.load import load_task

    task = load_task(spec.task, job_file.resolve().parent)
    tokenizer = load_tokenizer(resolve_model(spec.student.model, data_dir, verify=False))
    longest = sorted(task.train, key=lambda problem: prompt_tokens(task, problem, tokenizer), reverse=True)[:count]
    dataset = scratch / "longest-prompts.jsonl"
    dataset.write_text(
        "".join(json.dumps({"id": p.id, "question": p.question, "answer": p.answer}) + "\n" for p in longest)
    )
    return spec.model_copy(update={"task": spec.task.model_copy(update={"dataset": str(dataset), "held_out": 0})})


def run_job_file(
    job_file: Path, data_dir: Path, steps: int, every_group_trains: bool = False, longest_prompts: bool = False
) -> dict:
    """The first `steps` steps of a real job: planned peak (from its measured prompts) vs peak RSS.

    every_group_trains: a hash of each completion (bench/noise_reward.py) added to the job's rewards, so that
    every group has a reward spread and every sequence trains, as the plan budgets. Memory does not depend on
    what the rewards are, only on how many sequences train (and on the judge, which still runs).
    longest_prompts: train on the job's longest prompts only (with_longest_prompts), the widest batch planned.
    """
    import shutil
    import tempfile

    from appliance.job_checks import load_checked_job
    from appliance.paths import plugins_dir
    from appliance.config.schema import RewardSpec
    from appliance.grpo.run import run_job

    started = time.monotonic()
    scratch = tempfile.TemporaryDirectory()
    run_data = Path(scratch.name)
    shutil.copytree(PLUGINS, plugins_dir(run_data))  # bench environments, such as jobs/agent-at-bound.yaml's
    link_model_store(data_dir, run_data)
    spec = load_checked_job(job_file, run_data)
    if every_group_trains:
        spec = spec.model_copy(
            update={"rewards": [*spec.rewards, RewardSpec(name=f"{NOISE_REWARD}:noise", weight=1.0)]}
        )
    spec = spec.model_copy(
        update={
            "grpo": spec.grpo.model_copy(update={"steps": steps}),
            "checkpoint": spec.checkpoint.model_copy(update={"every": 10**6, "eval_every": None}),
        }
    )
    records, planned_components, loaded, choices = [], {}, {}, {}

    def on_event(event) -> None:
        if event.kind == "log" and "gradient checkpointing" in event.data.get("line", ""):
            line = event.data["line"]
            choices["gradient_checkpointing"] = "gradient checkpointing on" in line
            choices["rollout_weights"] = "merged_copy" if "merged_copy weights" in line else "shared"
        # The "memory" event comes once, after the trainer loaded its models: the RSS then is the resident base.
        if event.kind == "memory" and not planned_components:
            planned_components.update(event.data["planned_bytes"])
            loaded["rss_bytes"] = process_rss_bytes()

    with scratch:
        if longest_prompts:
            spec = with_longest_prompts(
                spec, data_dir, job_file, run_data, spec.grpo.prompts_per_step * spec.grpo.steps
            )
        run_job(
            spec,
            run_data,
            run_data / "jobs" / spec.name,
            job_file_dir=job_file.resolve().parent,
            on_step=records.append,
            on_event=on_event,
        )
        last = records[-1]
        planned, measured = last.memory.planned_peak_bytes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        trained = max(r.trained_sequences for r in records)
        longest = max((r.completion_length_max for r in records if r.trained_sequences), default=None)
        # An agent's record counts the tokens it trained, not its trajectories' length: no re-plan there.
        agent = spec.task.environment is not None
        at_trained = (
            plan_of_trained_batch(spec, data_dir, job_file, trained, choices, longest)
            if trained and not agent
            else None
        )
    return {
        "job": str(job_file),
        "steps": steps,
        "every_group_trains": every_group_trains,
        "longest_prompts": longest_prompts,
        "choices": choices,
        "planned_peak_bytes": planned,
        "measured_peak_bytes": measured,
        "ratio": measured / planned if planned else None,
        "planned_components": planned_components,
        "trained_sequences": [r.trained_sequences for r in records],
        "longest_trained_completion_tokens": longest,
        "planned_peak_of_trained_batch_bytes": at_trained,
        "ratio_to_trained_batch_plan": measured / at_trained if at_trained else None,
        "rss_after_load_bytes": loaded.get("rss_bytes"),
        "step_peak_rss_bytes": [r.memory.peak_rss_bytes for r in records],
        "step_seconds": [{phase: round(value, 1) for phase, value in r.seconds.items()} for r in records],
        "seconds": time.monotonic() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, default=None, help="run this job file's first steps with the trainer")
    parser.add_argument("--steps", type=int, default=2, help="with --job: steps to run (default 2)")
    parser.add_argument(
        "--every-group-trains",
        action="store_true",
        help="with --job: add a per-completion hash reward, so that every sequence trains",
    )
    parser.add_argument(
        "--longest-prompts",
        action="store_true",
        help="with --job: train on the job's longest prompts only (the widest batch the plan budgets)",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(__file__).resolve().parent.parent / ".test-cache" / "data"
    )
    parser.add_argument("--judge", action="store_true", help="also judge every completion with the unquantized model")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--sequences", type=int, default=32, help="sequences per step, a multiple of 8 (default 32)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.job is not None:
        result = run_job_file(args.job, args.data_dir, args.steps, args.every_group_trains, args.longest_prompts)
        print(
            json.dumps(result, indent=2)
            if args.json
            else f"{args.job}: planned {format_bytes(result['planned_peak_bytes'])}, measured peak RSS "
            f"{format_bytes(result['measured_peak_bytes'])}, measured/planned {result['ratio']:.2f} "
            f"({result['seconds']:.0f} s)"
        )
        if not args.json:
            print(
                "  planned: "
                + ", ".join(f"{k} {format_bytes(v)}" for k, v in result["planned_components"].items() if v)
            )
            print(f"  RSS after loading {format_bytes(result['rss_after_load_bytes'] or 0)}")
            if result["planned_peak_of_trained_batch_bytes"]:
                print(
                    f"  sequences trained per step {result['trained_sequences']}, longest completion "
                    f"{result['longest_trained_completion_tokens']} tokens: the plan for that batch "
                    f"{format_bytes(result['planned_peak_of_trained_batch_bytes'])}, measured/planned "
                    f"{result['ratio_to_trained_batch_plan']:.2f}"
                )
        return 0
    result = run(args.data_dir, args.judge, args.gradient_checkpointing, args.sequences)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'':<12}{'planned':>14}{'measured':>14}{'measured/planned':>18}")
    for name, row in result["phases"].items():
        m = row["measured_bytes"]
        print(
            f"{name:<12}{format_bytes(row['planned_bytes']):>14}{format_bytes(m) if m else '-':>14}"
            f"{m / row['planned_bytes'] if m else float('nan'):>18.2f}"
        )
    print(
        f"{'peak':<12}{format_bytes(result['planned_peak_bytes']):>14}"
        f"{format_bytes(result['measured_peak_bytes']):>14}{result['ratio']:>18.2f}"
    )
    for key, value in result["measured_bytes"].items():
        print(f"  RSS after {key}: {format_bytes(value)}")
    print(f"  ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
