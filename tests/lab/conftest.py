"""One tiny trained job shared by the lab tests (export round trip, tracker sinks): trained once per session.

builtin:multiply, one step of 2 prompts x 4 completions, 12 new tokens, 8
held-out problems evaluated before and after (`appliance train --eval`), so
best/ is the adapter the "after" accuracy was measured on. Both tracker sinks
are on, and the whole run happens with outbound connections refused.
"""

from __future__ import annotations

import json
import os
import socket
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
  held_out: 8
  system_prompt: Reply with the product inside answer tags.
  few_shot:
    - {{question: "What is 7 * 5?", answer: "7 * 5 = 35, so <answer>35</answer>"}}
    - {{question: "What is 3 * 4?", answer: "<answer>12</answer>"}}
rewards:
  - {{name: correctness, weight: 1.0}}
  - {{name: answer_format, weight: 0.5}}
grpo: {{group_size: 4, prompts_per_step: 2, max_new_tokens: 12, max_prompt_tokens: 96, learning_rate: 1.0e-3, steps: 1}}
checkpoint: {{every: 1, keep_last: 1, eval_every: null}}
tracking: {{tensorboard: true, wandb: true, wandb_project: lab-tests}}
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
    attempts: list = []
    with pytest.MonkeyPatch.context() as patch:
        block_outbound(patch, attempts)
        assert main(["train", str(job_file), "--data-dir", str(data_dir), "--eval"]) == 0
    job = TrainedJob(data_dir, job_file)
    job.outbound_attempts = attempts
    return job


def block_outbound(patch: pytest.MonkeyPatch, attempts: list) -> None:
    """Refuse connections and name lookups off the machine (as tests/conftest.py's no_network, session-wide)."""
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo
    local = ("127.0.0.1", "::1", "localhost", None)

    def guarded_connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in local:
            attempts.append(address)
            raise OSError(f"outbound connection to {address} blocked by the test")
        return connect(self, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host not in local:
            attempts.append(host)
            raise OSError(f"name lookup of {host} blocked by the test")
        return getaddrinfo(host, *args, **kwargs)

    patch.setattr(socket.socket, "connect", guarded_connect)
    patch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
