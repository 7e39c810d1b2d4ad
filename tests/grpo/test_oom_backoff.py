"""An out-of-memory error inside a step halves the micro-batch, retries the step, and the run goes on."""

from __future__ import annotations

import math

import pytest

from appliance.config.schema import JobSpec
from appliance.grpo.job import build_trainer, prepare_job_dir

pytestmark = pytest.mark.model


def test_forced_oom_is_survived_by_halving_the_micro_batch(tmp_path, store_data_dir):
    spec = JobSpec.model_validate({
        "name": "oom-run",
        "student": {"model": "smollm2-135m-instruct", "quantization": "nf4", "lora": {"rank": 8, "alpha": 16}},
        "task": {"dataset": "builtin:multiply", "held_out": 100,
                 "system_prompt": "Reply with the answer in the form <answer>N</answer>.",
                 "few_shot": [{"question": "What is 2 * 9?", "answer": "2 * 9 = 18, so <answer>18</answer>"}]},
        # Completion lengths differ within a group, so every group carries signal and step 1 trains.
        "rewards": [{"name": "length", "weight": 1.0, "params": {"target": 6}}],
        "grpo": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 10, "steps": 2, "micro_batch_size": 8,
                 "max_prompt_tokens": 96, "temperature": 1.5},
        "engine": {"rollout_weights": "shared"},
    })
    job_dir = prepare_job_dir(store_data_dir, spec, resume=False, restart=True)
    trainer = build_trainer(spec, tmp_path, store_data_dir, job_dir)
    assert trainer.ledger is not None
    trainer.updater.inject_oom_once = True
    first = trainer.train_step()
    second = trainer.train_step()
    assert first.trained_sequences > 0
    assert first.micro_batch_size == 4 and trainer.micro_batch_size == 4
    assert [(h.from_size, h.to_size) for h in trainer.ledger.halvings] == [(8, 4)]
    assert "out of memory, micro-batch 8 -> 4" in (job_dir / "log.txt").read_text()
    assert math.isfinite(first.loss) and first.grad_norm > 0
    assert second.step == 2 and second.micro_batch_size == 4
