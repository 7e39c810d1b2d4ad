"""Does training mode cost time? One demo-job micro-batch, forward + backward, in eval vs train mode, alternated.

    PYTHONPATH=. python bench/train_mode_cost.py [--rounds 3] [--sequences 32] [--data-dir DIR]

The trainer's Student (the demo job's: SmolLM2-135M-Instruct, nf4, LoRA r16 on
q/k/v/o, dropout 0, fp32) on 32 sequences (--sequences) of 97 prompt + 24
completion tokens (the demo job's longest prompt and its max_new_tokens, one
micro-batch as the CPU plan chooses). Each round times one `completion_logprobs(train=True)` +
backward in training mode and the same pass with the model held in eval mode,
then, for comparison, the same in training mode with gradient checkpointing
on. Rounds alternate the modes so that a drift in the machine's load hits both.
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

PROMPT, COMPLETION = 97, 24


def timed_pass(student: Student, batch: TokenBatch, train: bool) -> float:
    started = time.monotonic()
    if train:
        logprobs = student.completion_logprobs(batch, 1.0, train=True)
    else:  # the old code path: the model stays in eval mode for the gradient pass
        logprobs = student._logprobs(batch, 1.0, reference=False)
    logprobs.sum().backward()
    student.model.zero_grad(set_to_none=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument(
        "--data-dir", type=Path, default=Path(__file__).resolve().parent.parent / ".test-cache" / "data"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    model_dir = resolve_model("smollm2-135m-instruct", args.data_dir, verify=False)
    spec = StudentSpec.model_validate(job_dict()["student"])  # the GRPO step benchmark's student
    torch.manual_seed(0)
    ids = torch.randint(100, 40000, (args.sequences, PROMPT + COMPLETION))
    batch = TokenBatch(
        ids, torch.ones_like(ids), ids[:, PROMPT:], torch.ones(args.sequences, COMPLETION, dtype=torch.long)
    )
    students = {
        "plain": Student(spec, model_dir, "cpu"),
        "checkpointed": Student(spec, model_dir, "cpu", gradient_checkpointing=True),
    }
    timed_pass(students["plain"], batch, train=True)  # warm-up: first-use allocations, oneDNN primitives
    seconds: dict[str, list[float]] = {"eval mode": [], "train mode": [], "train mode + checkpointing": []}
    for _ in range(args.rounds):
        seconds["eval mode"].append(timed_pass(students["plain"], batch, train=False))
        seconds["train mode"].append(timed_pass(students["plain"], batch, train=True))
        seconds["train mode + checkpointing"].append(timed_pass(students["checkpointed"], batch, train=True))
    for name, values in seconds.items():
        print(f"{name:<28} median {statistics.median(values):6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
