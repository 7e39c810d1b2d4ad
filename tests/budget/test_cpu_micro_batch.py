"""On the CPU the fit takes the smallest micro-batch that keeps the CPU busy, not the largest that fits.

bench/micro_batch_speed.py (2026-11-27, SmolLM2-135M nf4 + LoRA, two threads): a 560-token micro-batch updated at
0.94x the tokens/s of a 1,120-token one, 280 tokens at 0.75x; a larger micro-batch only holds more activations.
"""

from __future__ import annotations

from appliance.budget.device import DeviceInfo
from appliance.budget.fit import SATURATING_MICRO_BATCH_TOKENS
from appliance.budget.plan import plan_job
from appliance.budget.shapes import fixture_for, load_config
from appliance.config.load import parse_job_text

TB = 2**40


def plan_on(kind: str, micro_batch: str = ""):
    job = parse_job_text(
        "name: micro-batch\n"
        "student: {model: Llama-3.1-8B, quantization: nf4, lora: {rank: 16, alpha: 32}}\n"
        "task: {dataset: builtin:multiply}\n"
        "rewards: [{name: correctness}]\n"
        f"grpo: {{group_size: 8, prompts_per_step: 4, max_new_tokens: 128{micro_batch}}}\n"
        "engine: {rollout: hf}\n",
        "<micro-batch>",
    )
    return plan_job(
        job, load_config(fixture_for("Llama-3.1-8B")), None, DeviceInfo(kind, TB, 0, kind), prompt_tokens=33
    )


def test_the_cpu_takes_the_smallest_micro_batch_that_saturates_it():
    plan = plan_on("cpu")
    tokens = plan.sequence_tokens["student"]  # 33 + 128 + 1
    # 32 sequences of 162 tokens: 4 (648 tokens) is the first size past 512; all 32 would fit a terabyte.
    assert plan.choices.micro_batch_size == 4 and 2 * tokens < SATURATING_MICRO_BATCH_TOKENS["cpu"] <= 4 * tokens
    assert plan.choices.grad_accumulation == 8
    assert f"{4 * tokens} tokens keep the cpu busy" in plan.render()


def test_a_gpu_and_the_job_file_still_take_what_fits():
    assert plan_on("cuda").choices.micro_batch_size == 32
    assert plan_on("cpu", ", micro_batch_size: 32").choices.micro_batch_size == 32
