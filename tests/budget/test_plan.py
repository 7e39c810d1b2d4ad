"""plan_job on real shapes: the GSM8K GPU example under 80, 24 and 8 GiB, phases and suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.budget.device_probe import DeviceInfo
from appliance.budget.plan import plan_job
from appliance.budget.shapes import fixture_for, load_config
from appliance.config.job_file import load_job, parse_job_text

GIB = 2**30
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gsm8k-qwen7b-gpu.yaml"


@pytest.fixture(scope="module")
def job():
    return load_job(EXAMPLE)


@pytest.fixture(scope="module")
def configs(job):
    return load_config(fixture_for(job.student.model)), load_config(fixture_for(job.judge.model))


def gpu(gib: int) -> DeviceInfo:
    return DeviceInfo("cuda", gib * GIB, 0, "fake")


def replan(job, configs, device, change: str):
    """Apply a suggestion like 'judge.quantization: nf4' to the job and plan again."""
    patched = job
    for item in change.split(" + "):
        key, value = item.split(": ")
        section, field = key.split(".")
        typed = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
        patched = patched.model_copy(update={section: getattr(patched, section).model_copy(update={field: typed})})
    return plan_job(patched, *configs, device)


def test_80gib_fits_with_every_phase_under_the_90_percent_budget(job, configs):
    plan = plan_job(job, *configs, gpu(80))
    assert plan.fits
    assert plan.budget_bytes == int(0.9 * 80 * GIB)
    assert plan.peak_bytes == max(phase.peak_bytes for phase in plan.phases.values()) <= plan.budget_bytes
    assert set(plan.phases) == {"generate", "judge", "train"}
    assert plan.overflow == [] and plan.suggestions == []
    # bf16 Qwen3-8B judge weights and the nf4 student are planned from their shapes.
    assert plan.components["judge_weights"] == 8_190_735_360 * 2
    assert 5.3 * GIB < plan.components["student_weights"] < 5.6 * GIB


def test_80gib_time_shares_because_256_sequences_and_16_long_judge_calls_do_not_fit_together(job, configs):
    plan = plan_job(job, *configs, gpu(80))
    assert plan.choices.time_share
    assert "each phase alone fits" in plan.choices.worded_reasons()["time_share"]
    # While training, the sleeping vLLM engines hold no weights and no KV cache on the GPU.
    train = plan.phases["train"].resident
    assert train["judge_weights"] == train["judge_kv"] == train["rollout_kv"] == 0
    assert plan.phases["judge"].resident["judge_weights"] == plan.components["judge_weights"]
    # vLLM's KV budget is what 256 sequences of 512 + 768 tokens need at 56 KiB a token.
    assert plan.choices.rollout_batch == 256
    assert plan.choices.rollout_kv_bytes == 256 * (512 + 768) * 56 * 1024
    assert plan.choices.micro_batch_size * plan.choices.grad_accumulation >= 256


def test_24gib_refuses_and_each_suggestion_fits_when_applied(job, configs):
    plan = plan_job(job, *configs, gpu(24))
    assert not plan.fits
    assert plan.overflow[0] == "judge_weights"
    assert "judge.quantization: nf4" in plan.suggestions
    assert plan.refusal().startswith("the judge phase needs ")
    assert plan.refusal().endswith("budget (overflowing: judge_weights); change judge.quantization: nf4")
    for suggestion in plan.suggestions:
        assert replan(job, configs, gpu(24), suggestion).fits, suggestion


def test_24gib_with_an_nf4_judge_time_shares_with_smaller_batches(job, configs):
    at_80 = plan_job(job, *configs, gpu(80))
    plan = replan(job, configs, gpu(24), "judge.quantization: nf4")
    assert plan.fits and plan.choices.time_share
    assert plan.choices.micro_batch_size < at_80.choices.micro_batch_size
    # vLLM rolls out from its own 4-bit copy at any budget: planned as such, not as a merged fp copy.
    assert plan.choices.worded_reasons()["rollout_weights"].startswith("vLLM holds its own copy of the student")
    assert "would need" in plan.choices.worded_reasons()["micro_batch_size"]


def test_8gib_refuses_with_the_student_and_judge_weights_overflowing(job, configs):
    plan = plan_job(job, *configs, gpu(8))
    assert not plan.fits
    assert "judge_weights" in plan.overflow
    text = plan.render()
    assert "does not fit" in text and "judge_weights" in text


def test_suggestions_combine_changes_when_no_single_one_is_enough(configs):
    job = parse_job_text(
        "name: t\nstudent: {model: /models/Qwen2.5-7B-Instruct}\n"
        "judge: {model: /models/Qwen3-8B, quantization: none}\nrewards: [{name: judge}]\n"
        "grpo: {group_size: 16, prompts_per_step: 16, max_new_tokens: 1024, max_prompt_tokens: 1024}\n"
        "student: {model: /models/Qwen2.5-7B-Instruct, gradient_checkpointing: false}\n".replace(
            "student: {model: /models/Qwen2.5-7B-Instruct}\n", "", 1
        )
    )
    # 18 GiB: the judge's bf16 weights overflow, and quantizing them alone is not enough (below 18 GiB, with the
    # allocator slack measured on an H200, nothing fits).
    plan = plan_job(job, *configs, gpu(18))
    assert not plan.fits
    assert len(plan.suggestions) == 1 and " + " in plan.suggestions[0]
    assert "judge.quantization: nf4" in plan.suggestions[0]
    assert replan(job, configs, gpu(18), plan.suggestions[0]).fits


def test_judge_sharing_the_student_base_holds_no_judge_weights(configs):
    job = parse_job_text(
        "name: t\nstudent: {model: /models/Qwen2.5-7B-Instruct}\n"
        "judge: {model: /models/Qwen2.5-7B-Instruct, share_student_base: true}\nrewards: [{name: judge}]\n"
    )
    plan = plan_job(job, configs[0], None, gpu(40))
    assert plan.components["judge_weights"] == 0
    assert plan.phases["judge"].resident["judge_kv"] > 0


def test_auto_fit_batches_grow_with_the_budget(job, configs):
    plans = [
        plan_job(
            job.model_copy(update={"judge": job.judge.model_copy(update={"quantization": "nf4"})}), *configs, gpu(gib)
        )
        for gib in (24, 40, 80, 192)
    ]
    assert all(plan.fits for plan in plans)
    micro = [plan.choices.micro_batch_size for plan in plans]
    rollout = [plan.choices.rollout_batch for plan in plans]
    assert micro == sorted(micro) and rollout == sorted(rollout)
    assert micro[0] < micro[-1]
    # With room to spare, the engines stay awake and rollouts get a merged bf16 copy (since the activation model
    # counts the fp32 LoRA input copies of a bf16 student, 160 GiB is no longer enough for both).
    assert not plans[-1].choices.time_share
    assert plans[-1].choices.rollout_weights == "merged_copy"
    assert all(
        set(plan.choices.reasons)
        >= {"micro_batch_size", "gradient_checkpointing", "rollout_weights", "time_share", "rollout_batch"}
        for plan in plans
    )


def test_checkpointing_is_chosen_only_when_needed(configs):
    job = parse_job_text(
        "name: t\nstudent: {model: /models/Qwen2.5-7B-Instruct}\nrewards: [{name: correctness}]\n"
        "grpo: {group_size: 4, prompts_per_step: 2, max_new_tokens: 128, max_prompt_tokens: 128}\n"
    )
    roomy = plan_job(job, configs[0], None, gpu(80))
    assert roomy.fits and not roomy.choices.gradient_checkpointing
    assert roomy.choices.micro_batch_size == 8 and roomy.choices.grad_accumulation == 1


def test_the_job_file_fixes_micro_batch_and_checkpointing(configs):
    job = parse_job_text(
        "name: t\nstudent: {model: /models/Qwen2.5-7B-Instruct, gradient_checkpointing: false}\n"
        "rewards: [{name: correctness}]\ngrpo: {micro_batch_size: 2}\n"
    )
    plan = plan_job(job, configs[0], None, gpu(80))
    assert plan.choices.micro_batch_size == 2 and plan.choices.grad_accumulation == 16
    assert not plan.choices.gradient_checkpointing
    assert "set by" in plan.choices.worded_reasons()["micro_batch_size"]


def test_a_memory_budget_in_bytes_is_used_as_given(configs):
    job = parse_job_text(
        "name: t\nstudent: {model: /models/Qwen2.5-7B-Instruct}\nrewards: [{name: correctness}]\n"
        "device: {memory_budget: 20GiB}\n"
    )
    assert plan_job(job, configs[0], None, gpu(80)).budget_bytes == 20 * GIB


def test_to_dict_carries_every_number_in_bytes(job, configs):
    document = plan_job(job, *configs, gpu(80)).to_dict()
    assert document["fits"] is True
    assert set(document["components"]) >= {
        "student_weights",
        "student_lora",
        "optimizer",
        "activations",
        "rollout_kv",
        "judge_weights",
        "judge_kv",
        "runtime",
    }
    assert document["choices"]["rollout_kv_bytes"] == document["phases"]["generate"]["resident"]["rollout_kv"]
    assert all(isinstance(v, int) for v in document["components"].values())


def test_vllm_rollout_weights_are_the_copy_vllm_loads(job, configs):
    """vLLM loads the 4-bit student with bitsandbytes on CUDA: its copy weighs what the trainer's base does,
    not the merged full-precision copy (plus fp32 LoRA targets) that only the transformers engine keeps."""
    plan = plan_job(job, *configs, gpu(80))
    generate = plan.phases["generate"].resident
    assert plan.rollout_engine == "vllm"
    assert generate["rollout_weights"] == generate["student_weights"]
    # The summary names vLLM's copy, not the transformers engine's merged copy it never builds.
    assert "rollout_weights vllm_copy," in plan.render()
    assert "rollout_weights merged_copy" not in plan.render()


def test_the_transformers_merged_copy_is_the_bf16_model_and_one_target_merging_at_a_time(job, configs):
    """The merged copy re-merges each LoRA target from the trainer's 4-bit base (engines/merged_copy.py): it holds
    the bf16 model but for the embeddings and head (the student's own), plus one target's fp32 weight and delta
    while it merges, not an fp32 copy of every target."""
    plan = replan(job, configs, gpu(80), "engine.rollout: hf + engine.rollout_weights: merged_copy")
    student = configs[0]
    hidden, intermediate = student["hidden_size"], student["intermediate_size"]
    assert plan.rollout_engine == "hf" and plan.choices.rollout_weights == "merged_copy"
    bf16_layers = plan.phases["generate"].resident["rollout_weights"] - 2 * 4 * hidden * intermediate
    # Qwen2.5-7B in bf16 is about 14.2 GiB, of which its untied embeddings and head (2 x 152064 x 3584) are
    # 2.0 GiB; the fp32 targets the copy used to keep were another 24 GiB.
    embeddings = 2 * student["vocab_size"] * hidden * 2
    assert not student["tie_word_embeddings"] and 2.0 * GIB < embeddings < 2.1 * GIB
    assert 14.0 * GIB < bf16_layers + embeddings < 14.4 * GIB


def test_on_the_cpu_a_micro_batch_past_512_tokens_without_checkpointing_ranks_above_a_larger_one_with_it(configs):
    """CPU throughput saturates near 512 tokens a micro-batch (fit.py), a GPU's near 16k: the same budget,
    where micro-batch 8 fits without checkpointing and 16 only with it, picks differently on each."""
    text = (
        "name: t\nstudent: {{model: /models/Qwen2.5-7B-Instruct{fixed}}}\nrewards: [{{name: correctness}}]\n"
        "grpo: {{group_size: 8, prompts_per_step: 2, max_new_tokens: 64, max_prompt_tokens: 64{micro}}}\n"
        # The trainer's own weights: no engine to put to sleep, so a time-shared plan cannot win instead.
        "engine: {{rollout: hf, rollout_weights: shared}}\n{budget}"
    )

    def plan(device: DeviceInfo, micro: int | None = None, checkpointing: bool | None = None, budget: int = 0):
        job = parse_job_text(
            text.format(
                fixed="" if checkpointing is None else f", gradient_checkpointing: {str(checkpointing).lower()}",
                micro="" if micro is None else f", micro_batch_size: {micro}",
                budget=f"device: {{memory_budget: {budget}}}\n" if budget else "",
            )
        )
        return plan_job(job, configs[0], None, device)

    for device, expected in ((DeviceInfo("cpu", 512 * GIB, 0, "fake"), (8, False)), (gpu(512), (16, True))):
        budget = plan(device, 8, False).peak_bytes
        assert plan(device, 16, False).peak_bytes > budget >= plan(device, 16, True).peak_bytes
        chosen = plan(device, budget=budget).choices
        assert (chosen.micro_batch_size, chosen.gradient_checkpointing) == expected, device.kind


@pytest.mark.parametrize(
    ("setting", "bf16_matmul", "expected"),
    [
        ("auto", True, "bfloat16"),
        ("auto", False, "float32"),
        ("compute", True, "float32"),
        ("bfloat16", False, "bfloat16"),
    ],
)
def test_a_merged_copy_of_an_fp32_student_is_bf16_where_the_cpu_multiplies_it(configs, setting, bf16_matmul, expected):
    """engine.rollout_dtype: the copy in bf16 holds 2 bytes a weight and shares nothing with the fp32 student,
    whose 4-bit layers stay 4-bit; in the compute dtype it shares the embeddings and the dequantized MLP."""
    from appliance.budget import components
    from appliance.budget.shapes import shape_from_config

    text = (
        "name: t\nstudent: {model: /models/Qwen2.5-7B-Instruct, compute_dtype: float32}\n"
        "rewards: [{name: correctness}]\ngrpo: {group_size: 4, prompts_per_step: 1, max_new_tokens: 32}\n"
        f"engine: {{rollout: hf, rollout_weights: merged_copy, rollout_dtype: {setting}}}\n"
    )
    cpu = DeviceInfo("cpu", 512 * GIB, 0, "fake", bf16_matmul=bf16_matmul)
    plan = plan_job(parse_job_text(text), configs[0], None, cpu)
    assert plan.rollout_dtype == expected and plan.to_dict()["rollout_dtype"] == expected
    on_its_own = plan_job(parse_job_text(text.replace("merged_copy", "shared")), configs[0], None, cpu)
    shape = shape_from_config(configs[0], "Qwen2.5-7B")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    untargeted = components.untargeted_linear_params(shape, targets)
    merging = components.merge_working_bytes(shape, targets)
    student = plan.components["student_weights"] - on_its_own.components["student_weights"]
    if expected == "bfloat16":
        assert student == 0  # all of its 4-bit layers, none dequantized
        assert plan.components["rollout_weights"] == shape.total_params * 2 + merging
    else:
        assert student == untargeted * 4 - components.four_bit_bytes(untargeted)  # the MLP dequantized, shared
        copied = shape.total_params - shape.embedding_params - untargeted
        assert plan.components["rollout_weights"] == copied * 4 + merging


def test_on_the_cpu_a_merged_copy_ranks_above_a_micro_batch_down_to_half_the_saturating_tokens(demo_model_dir):
    """Workload V's shape (2 prompts x 8, 32 new tokens, 39-token prompts): where micro-batch 8 fits only with
    the 4-bit rollouts and micro-batch 4 with a bf16 copy, the CPU takes the copy (284 tokens a micro-batch);
    where the copy fits only at micro-batch 2 (142 tokens) and the 4-bit rollouts at 4, the larger one."""
    config = load_config(demo_model_dir / "config.json")
    text = (
        "name: v\nstudent: {{model: {model}, compute_dtype: float32}}\nrewards: [{{name: correctness}}]\n"
        "grpo: {{group_size: 8, prompts_per_step: 2, max_new_tokens: 32, max_prompt_tokens: 39{micro}}}\n"
        "engine: {{rollout: hf, rollout_weights: {weights}}}\n{budget}"
    )
    cpu = DeviceInfo("cpu", 64 * GIB, 0, "fake", bf16_matmul=True)

    def plan(weights="auto", micro=None, budget=0):
        job = text.format(
            model=demo_model_dir,
            micro=f", micro_batch_size: {micro}" if micro else "",
            weights=weights,
            budget=f"device: {{memory_budget: {budget}}}\n" if budget else "",
        )
        return plan_job(parse_job_text(job), config, None, cpu)

    copy_at = {micro: plan("merged_copy", micro).peak_bytes for micro in (2, 4, 8)}
    shared_at = {micro: plan("shared", micro).peak_bytes for micro in (2, 4, 8)}
    assert plan("merged_copy").rollout_dtype == "bfloat16"
    budget = max(copy_at[4], shared_at[8])
    assert copy_at[8] > budget  # the copy does not fit beside micro-batch 8
    chosen = plan(budget=budget).choices
    assert (chosen.rollout_weights, chosen.micro_batch_size) == ("merged_copy", 4)
    budget = max(copy_at[2], shared_at[4])
    assert copy_at[4] > budget and shared_at[8] > budget
    chosen = plan(budget=budget).choices
    assert (chosen.rollout_weights, chosen.micro_batch_size) == ("shared", 4)
