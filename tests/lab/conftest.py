"""One tiny trained job shared by the lab tests (export round trip, tracker sinks): trained once per session.

builtin:multiply, 2 steps of 2 prompts x 4 completions, 16 new tokens, 16
held-out problems evaluated before and after (`appliance train --eval`). One
checkpoint, at the last step, so best/ is the adapter the "after" accuracy
was measured on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

JOB_NAME = "lab-tiny"
JOB_YAML = f"""\
name: {JOB_NAME}
student:
  model: smollm2-135m-instruct
  quantization: nf4
  lora: {{rank: 8, alpha: 16}}
task:
  dataset: builtin:multiply
  operand_min: 2
  operand_max: 12
  held_out: 16
  system_prompt: Reply with the product inside answer tags.
  few_shot:
    - {{question: "What is 7 * 5?", answer: "7 * 5 = 35, so <answer>35</answer>"}}
    - {{question: "What is 3 * 4?", answer: "<answer>12</answer>"}}
rewards:
  - {{name: correctness, weight: 1.0}}
  - {{name: answer_format, weight: 0.5}}
grpo: {{group_size: 4, prompts_per_step: 2, max_new_tokens: 16, max_prompt_tokens: 96, learning_rate: 1.0e-3, steps: 2}}
checkpoint: {{every: 2, keep_last: 1}}
"""


class TrainedJob:
    def __init__(self, data_dir: Path, job_file: Path):
        self.data_dir = data_dir
        self.job_file = job_file
        self.job_dir = data_dir / "jobs" / JOB_NAME

    @property
    def evaluation(self) -> dict:
        return json.loads((self.job_dir / "eval.json").read_text())


@pytest.fixture(scope="session")
def trained_job(tmp_path_factory, store_data_dir) -> TrainedJob:
    from appliance.cli.main import main

    root = tmp_path_factory.mktemp("lab")
    data_dir = root / "data"
    (data_dir / "models").mkdir(parents=True)
    for model in (store_data_dir / "models").iterdir():  # the provisioned store, linked (no copy)
        if not model.name.startswith("."):
            os.symlink(model, data_dir / "models" / model.name)
    job_file = root / "job.yaml"
    job_file.write_text(JOB_YAML)
    assert main(["train", str(job_file), "--data-dir", str(data_dir), "--eval"]) == 0
    return TrainedJob(data_dir, job_file)
