"""TaskSpec (the job file's `task` section) -> Task: picks the source, splits off held-out problems."""

from __future__ import annotations

from pathlib import Path

from appliance.config.schema import TaskSpec
from appliance.conventions import BUILTIN_DATASET_PREFIX
from appliance.suggest import closest
from appliance.tasks.task import FewShot, Task, TaskError, split_held_out
from appliance.tasks.gsm8k import load_gsm8k
from appliance.tasks.jsonl import load_jsonl_problems
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
