"""A short GRPO run whose reward includes the local judge (the bundled model judging itself).

The judge is the issue's bar: group (RULER-style) mode with probability
scoring, so every judge.jsonl line must be `ok` with a distribution per
response, and the judge's scores must differ within each group (a judge that
failed would give a whole group one neutral score, and the judge weight would
train nothing).
"""

from __future__ import annotations

import json

import pytest
import yaml

from appliance.cli.main import main

pytestmark = pytest.mark.model


def _job(share_student_base: bool) -> dict:
    return {
        "name": "judge-run",
        "student": {"model": "smollm2-135m-instruct", "quantization": "nf4", "lora": {"rank": 8, "alpha": 16}},
        "judge": {
            "model": "smollm2-135m-instruct",
            "mode": "group",
            "scoring": "probabilities",
            "share_student_base": share_student_base,
        },
        "task": {
            "dataset": "builtin:multiply",
            "held_out": 100,
            "system_prompt": "Reply with the answer in the form <answer>N</answer>.",
        },
        "rewards": [{"name": "correctness", "weight": 1.0}, {"name": "judge", "weight": 1.0}],
        "grpo": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 12, "steps": 2, "micro_batch_size": 8},
        "checkpoint": {"every": 2, "eval_every": None},
    }


def test_training_with_judge_reward_completes_and_logs_every_call(tmp_path, fresh_data_dir, capsys):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(_job(share_student_base=True)))
    assert main(["train", str(job_file), "--data-dir", str(fresh_data_dir)]) == 0
    job_dir = fresh_data_dir / "jobs" / "judge-run"
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for record in metrics:
        judge = record["rewards"]["judge"]
        assert 0.0 <= judge["mean"] <= 1.0 and judge["std"] >= 0.0
    calls = [json.loads(line) for line in (job_dir / "judge.jsonl").read_text().splitlines()]
    # group mode: each of a step's 2 groups read in judge.group_orders (4) orders, beside the differential check's
    # reading of the groups' answer cores in each order (at most one per group)
    full = sorted((call["step"], call["order"]) for call in calls if call["view"] == "full")
    assert full == sorted([(step, order) for step in (1, 2) for order in range(4)] * 2)
    core = [(call["step"], call["order"]) for call in calls if call["view"] == "core"]
    assert len(full) + len(core) == len(calls) and all(core.count(key) <= 2 for key in core)
    for call in calls:
        assert call["outcome"] == "ok" and call["scoring"] == "probabilities" and call["mode"] == "group"
        assert {"prompt", "raw_output", "scores", "retries", "latency_seconds"} <= set(call)
        assert len(call["distributions"]) == len(call["assigned"]) == 4
        assert all(reading["mass"] >= 0.5 and reading["probabilities"] for reading in call["distributions"])
        assert max(call["assigned"]) - min(call["assigned"]) > 1e-3  # the scores vary within the group
    outcomes = metrics[-1]["judge_outcomes"]
    assert outcomes.get("ok") == len(calls) and not outcomes.get("parse_error") and not outcomes.get("timeout")
    assert metrics[-1]["seconds"]["judge"] > 0
    assert (job_dir / "checkpoints" / "step-000002" / "adapter" / "adapter_model.safetensors").is_file()
