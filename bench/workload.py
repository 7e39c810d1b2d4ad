"""The GRPO step benchmark's workloads, shared by both workers so that they train on the same thing.

SmolLM2-135M-Instruct as NF4 + LoRA r16 (alpha 32) on q/k/v/o, fp32 compute,
2 prompts x 8 completions per step, at most 32 new tokens, temperature 1.0,
lr 2e-4, DAPO loss without KL, on `builtin:multiply` prompts. The workloads
differ only in their rewards:

    P  `correctness` (1.0) + `answer_format` (0.5): most groups of the base model
       score all 0, so our trainer skips them and TRL does not.
    V  P's rewards + `length` (0.5, target 12 tokens): completion lengths differ
       within a group, so every group has a reward spread and both sides train it.
    F  V with 8 worked examples as few-shot chat turns before each question
       (prompts of about 300 tokens instead of 37-39): where prompts dominate
       the sequence, a rollout copy's fixed cost weighs less against activations.

F differs from V in its task only (TASK_EXTRAS); both sides build their prompts
from the same task, so they get the same few-shot turns.

This module imports only the job schema and the task loader, so it runs in the
TRL venv as well as in ours.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (must precede every ML import)

from pathlib import Path

from appliance.config.schema import JobSpec
from appliance.tasks.load import load_task
from appliance.tasks.stream import ProblemStream

MODEL_NAME = "smollm2-135m-instruct"
TORCH_THREADS = 2
SYSTEM_PROMPT = "Reply with the answer in the form <answer>N</answer>."
# workload -> reward rule -> (weight, keyword arguments)
WORKLOADS = {
    "P": {"correctness": (1.0, {}), "answer_format": (0.5, {})},
    "V": {"correctness": (1.0, {}), "answer_format": (0.5, {}), "length": (0.5, {"target": 12})},
}
WORKLOADS["F"] = WORKLOADS["V"]
FEW_SHOT = [
    {"question": f"What is {a} * {b}?", "answer": f"{a} * {b} = {a * b}, so <answer>{a * b}</answer>"}
    for a, b in ((7, 5), (3, 4), (12, 11), (6, 9), (15, 3), (8, 8), (4, 13), (9, 7))
]
# workload -> task keys beside the dataset and the system prompt
TASK_EXTRAS = {"P": {}, "V": {}, "F": {"few_shot": FEW_SHOT}}
# workload -> the memory budget of our `ours-lean` side: 0.8x TRL's measured peak RSS (V: a median of 2.82 GiB
# over five rounds on 2026-11-28; F: 8.82-8.96 GiB over three), so that the budget manager, not a hand-picked
# setting, decides how our step fits in that much memory.
LEAN_MEMORY_BUDGETS = {"P": "2.25GiB", "V": "2.25GiB", "F": "7.1GiB"}


def job_dict(
    rollout_weights: str = "auto", steps: int = 4, workload: str = "P", memory_budget: str | None = None
) -> dict:
    """Our job file for a workload; the bench varies `rollout_weights` and the memory budget on our side."""
    job = {
        "name": "bench-grpo-step",
        "student": {
            "model": MODEL_NAME,
            "quantization": "nf4",
            "compute_dtype": "float32",
            "lora": {
                "rank": 16,
                "alpha": 32,
                "dropout": 0.0,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            },
        },
        "task": {"dataset": "builtin:multiply", "system_prompt": SYSTEM_PROMPT, **TASK_EXTRAS[workload]},
        "rewards": [
            {"name": name, "weight": weight, "params": params} for name, (weight, params) in WORKLOADS[workload].items()
        ],
        "grpo": {
            "group_size": 8,
            "prompts_per_step": 2,
            "max_new_tokens": 32,
            "temperature": 1.0,
            "learning_rate": 2.0e-4,
            "loss": "dapo",
            "beta": 0.0,
            # Far past the measured steps, so that no end-of-run checkpoint lands inside a timed step.
            "steps": steps + 1000,
        },
        "engine": {"rollout": "hf", "rollout_weights": rollout_weights},
        "checkpoint": {"every": 100000},
    }
    if memory_budget is not None:
        job["device"] = {"memory_budget": memory_budget}
    return job


def job_spec(
    rollout_weights: str = "auto", steps: int = 4, workload: str = "P", memory_budget: str | None = None
) -> JobSpec:
    return JobSpec.model_validate(job_dict(rollout_weights, steps, workload, memory_budget))


def prompts_in_step_order(steps: int, workload: str = "P") -> list[dict]:
    """The problems our trainer draws in its first `steps` steps, in order, as TRL dataset rows.

    Each row has chat `prompt` messages and the reference `answer`; fed to TRL
    unshuffled, its step k gets the same two prompts as our step k.
    """
    spec = job_spec(steps=steps, workload=workload)
    task = load_task(spec.task, Path.cwd())
    stream = ProblemStream(task.train, seed=spec.task.seed)
    problems = stream.next_batch(steps * spec.grpo.prompts_per_step)
    return [
        {"prompt": task.messages(problem), "answer": problem.answer, "question": problem.question}
        for problem in problems
    ]
