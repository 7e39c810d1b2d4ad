"""The plan's time-sharing, applied per phase (grpo/trainer.py), on two CUDA vLLM engines at the hardware boundary.

The engines are the real VLLMEngine over test_vllm_call_order's recording fake of
a CUDA box's vllm.LLM, which refuses to generate while asleep.
"""

from __future__ import annotations

import pytest

from appliance.grpo.trainer import enter_phase
from test_vllm_call_order import SAMPLING, cuda_engine, model_dir  # noqa: F401  (model_dir is a fixture)


def one_step(rollout, judge, time_share: bool) -> None:
    enter_phase("generate", rollout, judge, time_share)
    rollout.generate(["p"], SAMPLING)
    enter_phase("judge", rollout, judge, time_share)
    judge.generate(["judge this"], SAMPLING)
    enter_phase("train", rollout, judge, time_share)


def test_time_shared_step_keeps_only_the_phases_engine_awake(model_dir):  # noqa: F811
    rollout, judge = cuda_engine(model_dir, model_name="student"), cuda_engine(model_dir, model_name="judge")

    one_step(rollout, judge, time_share=True)
    # During training both sleep: the plan counted neither engine's weights nor KV cache in the train phase.
    assert rollout.llm.asleep == judge.llm.asleep == {"weights", "kv_cache"}
    one_step(rollout, judge, time_share=True)

    # The judge sleeps before the rollouts, the rollout engine before the judge: never both awake.
    wake = ["wake_up(['weights'])", "wake_up(['kv_cache'])"]
    assert rollout.llm.calls == [
        "generate(lora=None)",
        "sleep(level=1)",
        *wake,
        "generate(lora=None)",
        "sleep(level=1)",
    ]
    assert judge.llm.calls == [
        "sleep(level=1)",
        *wake,
        "generate(lora=None)",
        "sleep(level=1)",
        *wake,
        "generate(lora=None)",
        "sleep(level=1)",
    ]


def test_without_time_sharing_no_engine_ever_sleeps(model_dir):  # noqa: F811
    rollout, judge = cuda_engine(model_dir, model_name="student"), cuda_engine(model_dir, model_name="judge")
    for _ in range(2):
        one_step(rollout, judge, time_share=False)
    assert rollout.llm.calls == judge.llm.calls == ["generate(lora=None)"] * 2


def test_a_job_without_a_judge_sleeps_the_rollout_engine_for_training_only(model_dir):  # noqa: F811
    rollout = cuda_engine(model_dir)
    enter_phase("generate", rollout, None, True)
    rollout.generate(["p"], SAMPLING)
    enter_phase("judge", rollout, None, True)
    enter_phase("train", rollout, None, True)
    assert rollout.llm.calls == ["generate(lora=None)", "sleep(level=1)"]
    with pytest.raises(ValueError, match="'update'"):
        enter_phase("update", rollout, None, True)
