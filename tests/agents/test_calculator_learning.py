"""The agent learning test: GRPO on builtin:calculator makes the bundled model better at using its tool.

Trains the real 4-bit + LoRA student on the CPU through run_job (the path `appliance train --eval` takes) and
compares greedy held-out success (the right product in answer tags, after a multiply call) before and after.
The margin was written here before the test was first run; see the closing note for what was measured.
"""

from __future__ import annotations

import json

import pytest

from appliance.config.checks import load_checked_job
from appliance.grpo.records import read_jsonl
from appliance.grpo.run import run_job

pytestmark = [pytest.mark.slow, pytest.mark.model]

MIN_SUCCESS_GAIN = 0.10  # held-out success, after minus before, on the same 20 greedy episodes
HELD_OUT_SCENARIOS = 20

JOB = """\
name: calculator-learning
student: {model: smollm2-135m-instruct, quantization: nf4, lora: {rank: 16, alpha: 32}}
task: {environment: "builtin:calculator", max_turns: 2}
rewards: [{name: environment}]
grpo: {group_size: 4, prompts_per_step: 4, max_new_tokens: 32, temperature: 1.0, learning_rate: 3.0e-4, steps: 8,
       micro_batch_size: 16}
checkpoint: {every: 8}
"""


def test_calculator_agent_improves_held_out_success(tmp_path, fresh_data_dir):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    job_dir = fresh_data_dir / "jobs" / "calculator-learning"
    result = run_job(load_checked_job(job_file, fresh_data_dir), fresh_data_dir, job_dir, job_file_dir=tmp_path,
                     evaluate=True, eval_limit=HELD_OUT_SCENARIOS)
    summary = json.loads((job_dir / "eval.json").read_text())
    before, after = summary["before"], summary["after"]
    metrics = read_jsonl(job_dir / "metrics.jsonl")
    print(f"held-out success {before['accuracy']:.3f} -> {after['accuracy']:.3f}, tool use "
          f"{before['format_compliance']:.3f} -> {after['format_compliance']:.3f}, rewards per step "
          f"{[round(m['reward_mean'], 3) for m in metrics]}")
    assert result.status == "completed" and before["problems"] == after["problems"] == HELD_OUT_SCENARIOS
    assert after["accuracy"] - before["accuracy"] >= MIN_SUCCESS_GAIN
    assert after["reward_means"]["total"] > before["reward_means"]["total"]
