"""Where does a bigger micro-batch stop paying? One update's forward + backward, split into micro-batches.

    PYTHONPATH=. python bench/micro_batch_speed.py [--rounds 3] [--sequences 16] [--prompt 38 --completion 32]

The trainer's Student (SmolLM2-135M-Instruct, nf4, LoRA r16 on q/k/v/o, dropout 0, fp32, 2 torch threads) on
`--sequences` sequences of prompt + completion tokens (default: workload V of bench/grpo_step.py, 38 + 32),
passed as micro-batches of each size in `--sizes` (gradients accumulate over them, as in the trainer's update).
Rounds alternate the sizes, so a drift in the machine's load hits them all. Prints each size's median seconds
and its tokens/s against the largest size's: whether a smaller micro-batch (less activation memory) costs speed.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (must precede every ML import)

import argparse
import statistics
import time
from pathlib import Path

import torch

from appliance.config.schema import StudentSpec
from appliance.grpo.student import Student, TokenBatch
from appliance.models.store import resolve_model
from workload import job_dict


def batch_of(ids: torch.Tensor, prompt: int) -> TokenBatch:
    return TokenBatch(ids, torch.ones_like(ids), ids[:, prompt:], torch.ones_like(ids[:, prompt:]))


def timed_update(student: Student, ids: torch.Tensor, prompt: int, micro_batch: int) -> float:
    started = time.monotonic()
    for start in range(0, ids.shape[0], micro_batch):
        student.completion_logprobs(
            batch_of(ids[start : start + micro_batch], prompt), 1.0, train=True
        ).sum().backward()
    student.model.zero_grad(set_to_none=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=38)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--sizes", default="16,8,4,2,1")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(__file__).resolve().parent.parent / ".test-cache" / "data"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    torch.set_num_threads(2)
    spec = StudentSpec.model_validate(job_dict()["student"])  # the GRPO step benchmark's student
    student = Student(spec, resolve_model("smollm2-135m-instruct", args.data_dir, verify=False), "cpu")
    torch.manual_seed(0)
    ids = torch.randint(100, 40000, (args.sequences, args.prompt + args.completion))
    for size in sizes:  # warm-up: first-use allocations and oneDNN primitives of every shape
        timed_update(student, ids, args.prompt, size)
    seconds: dict[int, list[float]] = {size: [] for size in sizes}
    for round_index in range(args.rounds):
        for size in sizes if round_index % 2 == 0 else reversed(sizes):
            seconds[size].append(timed_update(student, ids, args.prompt, size))
    tokens = args.sequences * (args.prompt + args.completion)
    largest = statistics.median(seconds[max(sizes)])
    print(f"{args.sequences} sequences x {args.prompt + args.completion} tokens, {args.rounds} rounds")
    for size in sizes:
        median = statistics.median(seconds[size])
        print(
            f"micro-batch {size:>3} ({size * (args.prompt + args.completion):>5} tokens): median {median:6.2f} s, "
            f"{tokens / median:7.0f} tokens/s = {largest / median:.2f}x the largest  "
            f"({', '.join(f'{v:.2f}' for v in seconds[size])})"
        )


if __name__ == "__main__":
    main()
