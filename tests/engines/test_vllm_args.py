"""vLLM's arguments as data: a job spec and its plan in, vllm.LLM's keyword arguments out (no vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config.schema import JobSpec
from appliance.engines.vllm_args import VllmSettings, judge_settings, llm_args, student_settings

GIB = 1 << 30
MODEL = Path("/models/student")


def job_spec() -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "demo",
            "student": {"model": "smollm2-135m-instruct", "quantization": "nf4", "lora": {"rank": 4}},
            "judge": {"model": "smollm2-135m-instruct", "mode": "group", "max_new_tokens": 64},
            "rewards": [{"name": "correctness"}],
            "grpo": {"group_size": 4, "max_prompt_tokens": 256, "max_new_tokens": 32, "seed": 7},
        }
    )


def test_a_cuda_student_gets_the_plans_kv_cache_its_rank_sleep_mode_and_quantization():
    settings = student_settings(job_spec(), MODEL, device="cuda", kv_cache_bytes=5 * GIB + 1, quantize=True)

    assert llm_args(settings) == {
        "model": "/models/student",
        "served_model_name": "smollm2-135m-instruct",
        "dtype": "bfloat16",
        "seed": 7,
        "max_model_len": 256 + 32,
        "tensor_parallel_size": 1,
        "kv_cache_memory_bytes": 5 * GIB + 1,
        "logprobs_mode": "processed_logprobs",
        "enforce_eager": False,
        "disable_log_stats": False,
        "enable_lora": True,
        "generation_config": "vllm",
        "enable_prefix_caching": True,
        "max_lora_rank": 8,  # rank 4 rounded up to a rank vLLM accepts
        "max_loras": 1,
        "max_cpu_loras": 2,
        "quantization": "bitsandbytes",
        "enable_sleep_mode": True,
    }


def test_a_cpu_judge_has_no_lora_no_sleep_mode_its_own_name_and_is_tensor_parallel_over_its_devices():
    settings = judge_settings(job_spec(), MODEL, device="cpu", kv_cache_bytes=2 * GIB, devices=("2", "3"))

    args = llm_args(settings)

    assert args["served_model_name"] == "smollm2-135m-instruct-judge"
    assert (args["dtype"], args["enforce_eager"], args["enable_lora"]) == ("float32", True, False)
    assert args["max_model_len"] == 256 + 4 * 32 + 64  # group mode: the whole group in the judge's prompt
    assert args["tensor_parallel_size"] == 2 and settings.visible_devices == ("2", "3")
    assert "distributed_executor_backend" not in args  # vLLM's own workers on the judge's devices
    assert args["enable_prefix_caching"] is True  # a group's responses share the judge's rubric prefix
    assert not {"max_lora_rank", "enable_sleep_mode", "quantization"} & args.keys()


def test_a_cpu_engine_without_a_plan_gets_one_gib_and_a_cuda_one_is_refused():
    assert student_settings(job_spec(), MODEL, device="cpu").kv_cache_bytes == GIB
    with pytest.raises(ValueError, match=r"needs its KV cache size from the budget plan \(judge_kv_bytes\)"):
        judge_settings(job_spec(), MODEL, device="cuda")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"device": "tpu"}, "device must be 'cuda' or 'cpu', got 'tpu'"),
        ({"dtype": "int8"}, "dtype must be one of auto, float32, bfloat16, float16, got 'int8'"),
        ({"kv_cache_bytes": 0}, "kv_cache_bytes must be positive, got 0"),
        ({"max_lora_rank": 1024}, "LoRA rank 1024 is above vLLM's largest max_lora_rank 512"),
    ],
)
def test_settings_vllm_would_refuse_are_refused_with_the_field_named(overrides, message):
    fields = {"model_name": "student", "kv_cache_bytes": GIB} | overrides
    with pytest.raises(ValueError, match=message):
        VllmSettings(MODEL, **fields)
