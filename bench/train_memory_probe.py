"""The train phase's peak RSS at chosen shapes, with the real Student and GrpoUpdater: the CPU fit's data.

The planner's CPU activation constants (budget/components.py) are fitted to
what one GRPO update costs on the bundled SmolLM2-135M-Instruct (nf4 + LoRA r16
on q/k/v/o, fp32 compute). A whole job (bench/memory_plan.py --job) measures
one shape per run; this probe measures the update alone at any shape, each in
a fresh interpreter so that no earlier shape's heap is counted:

    python bench/train_memory_probe.py --shape 32x97+24 --shape 8x266+256 [--checkpointing] [--json]

A shape is SEQUENCESxPROMPT+COMPLETION tokens, all in one micro-batch. Each line
gives the RSS after loading, the update's peak (VmHWM, reset before it), the
measured activations (peak - RSS after loading) and the planner's train-phase
activations for that shape, with their ratio.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (must precede every ML import)

import argparse
import json
import subprocess
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def parse_shape(text: str) -> tuple[int, int, int]:
    sequences, rest = text.split("x")
    prompt, completion = rest.split("+")
    return int(sequences), int(prompt), int(completion)


def planned_activations(model_dir: Path, sequences: int, prompt: int, completion: int, checkpointing: bool) -> int:
    from appliance.budget import components
    from appliance.budget.shapes import load_config, shape_from_config

    shape = shape_from_config(load_config(model_dir / "config.json"))
    return components.activation_bytes(
        shape, sequences, prompt + completion, completion + 1, 4, checkpointing, LORA_TARGETS, device_kind="cpu"
    )


def measure(data_dir: Path, sequences: int, prompt: int, completion: int, checkpointing: bool) -> dict:
    """One update on random tokens at this shape, in this process (call it in a fresh one)."""
    import torch

    from appliance.budget.device_probe import process_rss_bytes
    from appliance.budget.host_allocator import pin_mmap_threshold
    from appliance.config.schema import GrpoSpec, LoraSpec, StudentSpec
    from appliance.grpo.update import make_optimizer, make_scheduler
    from appliance.grpo.student import Student
    from appliance.grpo.update import GrpoUpdater, TrainSample
    from appliance.models.store import resolve_model
    from memory_plan import high_water_bytes, reset_high_water

    pin_mmap_threshold()  # as build_trainer does
    torch.set_num_threads(2)
    model_dir = resolve_model("smollm2-135m-instruct", data_dir, verify=False)
    spec = StudentSpec(
        model="smollm2-135m-instruct",
        quantization="nf4",
        compute_dtype="float32",
        lora=LoraSpec(rank=16, alpha=32, dropout=0.0, target_modules=LORA_TARGETS),
    )
    student = Student(spec, model_dir, "cpu", gradient_checkpointing=checkpointing)
    grpo = GrpoSpec(max_new_tokens=completion, group_size=8, prompts_per_step=max(1, sequences // 8))
    optimizer = make_optimizer(student.trainable_parameters(), grpo, "cpu")
    updater = GrpoUpdater(student, optimizer, make_scheduler(optimizer, grpo), grpo)
    generator = torch.Generator().manual_seed(0)
    samples = [
        TrainSample(
            prompt_ids=torch.randint(100, 40000, (prompt,), generator=generator).tolist(),
            completion_ids=torch.randint(100, 40000, (completion,), generator=generator).tolist(),
            advantage=1.0 if index % 2 else -1.0,
        )
        for index in range(sequences)
    ]
    loaded = process_rss_bytes()
    reset_high_water()
    updater.step(samples, micro_batch_size=sequences)
    peak = high_water_bytes()
    planned = planned_activations(model_dir, sequences, prompt, completion, checkpointing)
    return {
        "sequences": sequences,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "gradient_checkpointing": checkpointing,
        "rss_after_load_bytes": loaded,
        "update_peak_bytes": peak,
        "measured_activation_bytes": peak - loaded,
        "planned_activation_bytes": planned,
        "measured_over_planned": (peak - loaded) / planned,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True, help="SEQUENCESxPROMPT+COMPLETION, e.g. 32x97+24")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--data-dir", type=Path, default=PROJECT_DIR / ".test-cache" / "data")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.in_process:
        print(json.dumps(measure(args.data_dir, *parse_shape(args.shape[0]), args.checkpointing)))
        return 0
    results = []
    for shape in args.shape:
        command = [sys.executable, __file__, "--in-process", "--shape", shape, "--data-dir", str(args.data_dir)]
        if args.checkpointing:
            command.append("--checkpointing")
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=True,
            env={
                "PYTHONPATH": f"{PROJECT_DIR}:{PROJECT_DIR / 'bench'}",
                "OMP_NUM_THREADS": "2",
                "PATH": "/usr/bin:/bin",
            },
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        if not args.json:
            gib = 2**30
            print(
                f"{shape:>12}: after load {result['rss_after_load_bytes'] / gib:.2f} GiB, update peak "
                f"{result['update_peak_bytes'] / gib:.2f} GiB, activations measured "
                f"{result['measured_activation_bytes'] / gib:.2f} GiB, planned "
                f"{result['planned_activation_bytes'] / gib:.2f} GiB ({result['measured_over_planned']:.2f})",
                flush=True,
            )
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
