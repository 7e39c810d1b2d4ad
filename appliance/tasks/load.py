"""TaskSpec (the job file's `task` section) -> Task: picks the source, splits off held-out problems."""

from __future__ import annotations

from pathlib import Path

from appliance.config.schema import TaskSpec
from appliance.conventions import BUILTIN_DATASET_PREFIX
from appliance.suggest import closest
from appliance.tasks.task import FewShot, Task, TaskError, split_held_out
from appliance.tasks.gsm8k import GSM8K_TRAIN_SIZE, load_gsm8k
from appliance.tasks.jsonl import count_problems, load_jsonl_problems
from appliance.tasks.multiply import load_multiply

BUILTINS = ("multiply", "gsm8k")


def load_task(spec: TaskSpec, base_dir: Path) -> Task:
    """Load and validate the whole dataset now, so a bad file fails before training starts.

    A dataset path is relative to `base_dir` (the job file's folder) unless absolute.
    """
    dataset = spec.dataset
    if dataset.startswith(BUILTIN_DATASET_PREFIX):
        builtin = dataset[len(BUILTIN_DATASET_PREFIX) :]
        if builtin == "multiply":
            train, held_out = load_multiply(spec.operand_min, spec.operand_max, spec.held_out, spec.seed)
        elif builtin == "gsm8k":
            train, held_out = split_held_out(load_gsm8k(), spec.held_out, spec.seed, source=dataset)
        else:
            close = closest(builtin, BUILTINS)
            hint = f"; did you mean '{BUILTIN_DATASET_PREFIX}{close}'?" if close else ""
            raise TaskError(
                f"task.dataset: unknown built-in {dataset!r}{hint}"
                f" (built-ins: {', '.join(BUILTIN_DATASET_PREFIX + name for name in BUILTINS)}, or a path to a .jsonl file)"
            )
        name = dataset
    else:
        path = Path(dataset).expanduser()
        if not path.is_absolute():
            path = Path(base_dir) / path
        train, held_out = split_held_out(load_jsonl_problems(path), spec.held_out, spec.seed, source=str(path))
        name = path.stem
    few_shot = tuple(FewShot(example.question, example.answer) for example in spec.few_shot)
    return Task(name=name, train=train, held_out=held_out, system_prompt=spec.system_prompt, few_shot=few_shot)


def held_out_problem(spec: TaskSpec, base_dir: Path) -> str | None:
    """What `load_task` would refuse about the task, found by counting its problems (none is built or kept):
    a dataset that cannot be read or holds a bad row (TaskError), or task.held_out leaving nothing to train on."""
    dataset = spec.dataset
    if dataset == BUILTIN_DATASET_PREFIX + "multiply":
        size = (spec.operand_max - spec.operand_min + 1) ** 2
        if spec.held_out >= size:
            return (
                f"task.held_out ({spec.held_out}) must be smaller than the {size} multiply problems"
                f" (operands {spec.operand_min}..{spec.operand_max}, {spec.operand_max - spec.operand_min + 1}^2"
                " ordered pairs); lower task.held_out or widen task.operand_min/task.operand_max"
            )
        return None
    if dataset == BUILTIN_DATASET_PREFIX + "gsm8k":
        size, source = GSM8K_TRAIN_SIZE, dataset
    else:
        path = Path(dataset).expanduser()
        path = path if path.is_absolute() else Path(base_dir) / path
        size, source = count_problems(path), str(path)
    if spec.held_out >= size:
        return (
            f"task.held_out ({spec.held_out}) must be smaller than the {size} problems of {source};"
            " lower task.held_out or use a larger dataset"
        )
    return None
