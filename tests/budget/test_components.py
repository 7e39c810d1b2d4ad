"""Bytes per component: 4-bit packing, LoRA, optimizer, activations, KV, runtime."""

from __future__ import annotations

import pytest

from appliance.budget import components
from appliance.budget.shapes import ShapeError, fixture_for, load_config, shape_from_config

GIB = 2**30
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def shape(name: str):
    return shape_from_config(load_config(fixture_for(name)), name)


def test_nf4_packs_linear_weights_in_half_a_byte_with_an_fp32_absmax_per_64():
    qwen = shape("Qwen2.5-7B")
    linear = qwen.linear_params
    expected = linear // 2 + (linear // 64) * 4 + qwen.unquantized_params * 2
    assert components.weights_bytes(qwen, "nf4", 2) == expected
    # 7.6B parameters in nf4 with bf16 embeddings: about 5.5 GiB, a third of bf16.
    assert components.weights_bytes(qwen, "nf4", 2) / GIB == pytest.approx(5.45, abs=0.05)
    assert components.weights_bytes(qwen, "none", 2) == qwen.total_params * 2


def test_double_quantization_stores_absmax_in_8_bits():
    llama = shape("Llama-3.1-8B")
    single, double = (
        components.weights_bytes(llama, "nf4", 2),
        components.weights_bytes(llama, "nf4", 2, double_quant=True),
    )
    blocks = llama.linear_params // 64
    assert single - double == blocks * 4 - (blocks + -(-blocks // 256) * 4)


def test_fp4_costs_the_same_as_nf4_and_int8_one_byte_per_weight_plus_row_scales():
    qwen3 = shape("Qwen3-8B")
    assert components.weights_bytes(qwen3, "fp4", 2) == components.weights_bytes(qwen3, "nf4", 2)
    rows = 36 * (4096 + 1024 + 1024 + 4096 + 12288 + 12288 + 4096)
    assert components.weights_bytes(qwen3, "int8", 2) == qwen3.linear_params + rows * 4 + qwen3.unquantized_params * 2


def test_lm_head_and_embeddings_stay_in_the_compute_dtype_under_nf4():
    # Gemma-2's 256k x 3584 tied embedding is 1.7 GiB of bf16 next to 3.9 GiB of packed linears.
    gemma = shape("Gemma-2-9B")
    assert gemma.embedding_params * 2 / GIB == pytest.approx(1.71, abs=0.01)
    assert components.weights_bytes(gemma, "nf4", 2) > gemma.embedding_params * 2 + gemma.linear_params // 2


def test_lora_rank16_on_attention_of_llama_8b():
    llama = shape("Llama-3.1-8B")
    per_layer = 16 * ((4096 + 4096) + (4096 + 1024) + (4096 + 1024) + (4096 + 4096))
    assert components.lora_params(llama, 16, ATTENTION) == 32 * per_layer == 13_631_488
    # fp32 parameters and gradients, AdamW 32-bit two fp32 states, paged 8-bit two bytes.
    assert components.student_lora_bytes(13_631_488) == 13_631_488 * 8
    assert components.optimizer_bytes(13_631_488) == 13_631_488 * 8
    assert components.optimizer_bytes(13_631_488, "paged_adamw_8bit") == 13_631_488 * 2


def test_lora_all_linear_and_an_unknown_target():
    llama = shape("Llama-3.1-8B")
    assert components.lora_params(llama, 8, ["all-linear"]) > components.lora_params(llama, 8, ATTENTION)
    with pytest.raises(ShapeError, match="c_attn is not a linear layer"):
        components.lora_params(llama, 8, ["c_attn"])


def test_logprobs_cost_one_chunk_of_logits_not_batch_x_completion_x_vocab():
    qwen = shape("Qwen2.5-7B")
    # 256 MiB of fp32 logits per chunk: 441 tokens of Qwen's 152,064-token vocabulary.
    assert components.logit_chunk_tokens(152064) == 441
    tokens = 32 * 1024
    chunk = components.LOGIT_CHUNK_COPIES * 441 * 152064 * 4
    head_input_and_gradient = 2 * tokens * 3584 * 2
    assert components.logprob_bytes(qwen, tokens, 2) == chunk + head_input_and_gradient
    # Past one chunk, another token costs its hidden state and gradient only, not another row of logits.
    one_more = components.activation_bytes(qwen, 4, 1024, 513, 2, True, ATTENTION) - components.activation_bytes(
        qwen, 4, 1024, 512, 2, True, ATTENTION
    )
    assert one_more == 4 * 2 * 3584 * 2
    # Fewer tokens than a chunk: the chunk is that small.
    assert components.logprob_bytes(qwen, 10, 2) == components.LOGIT_CHUNK_COPIES * 10 * 152064 * 4 + 2 * 10 * 3584 * 2


def test_on_the_cpu_a_logit_chunk_is_32_mib():
    qwen = shape("Qwen2.5-7B")
    assert components.logit_chunk_tokens(152064, components.logit_chunk_bytes("cpu")) == 55
    assert components.logit_chunk_bytes("mps") == components.logit_chunk_bytes(
        "cuda"
    )  # any accelerator: the GPU's size
    tokens = 4096
    assert (
        components.logprob_bytes(qwen, tokens, 4, "cpu")
        == components.LOGIT_CHUNK_COPIES * 55 * 152064 * 4 + 2 * tokens * 3584 * 4
    )


def test_on_the_cpu_saved_tensors_under_the_mmap_threshold_are_planned_with_the_heap_extra():
    llama = shape("Llama-3.1-8B")
    # fp32 [tokens, width] tensors reach glibc's 4 MiB at 256 tokens for the hidden size (4096), at 1,024 for
    # k and v (8 kv heads x 128). Per token and layer: two norm inputs, q, the attention output, and the LoRA
    # inputs of q/k/v (one shared fp32 tensor) and of o; then k and v.
    hidden_size_bytes, kv_bytes = 6 * 4096 * 4, 2 * 1024 * 4
    assert components.cpu_heap_extra_bytes(llama, 255, 4, False, ATTENTION) == int(
        components.CPU_HEAP_EXTRA * 32 * 255 * (hidden_size_bytes + kv_bytes)
    )
    assert components.cpu_heap_extra_bytes(llama, 256, 4, False, ATTENTION) == int(
        components.CPU_HEAP_EXTRA * 32 * 256 * kv_bytes
    )
    assert components.cpu_heap_extra_bytes(llama, 1024, 4, False, ATTENTION) == 0
    # With checkpointing one layer keeps its tensors, and every layer its input.
    assert components.cpu_heap_extra_bytes(llama, 255, 4, True, ATTENTION) == int(
        components.CPU_HEAP_EXTRA * (255 * (hidden_size_bytes + kv_bytes) + 32 * 4096 * 4 * 255)
    )
    # gate/up's LoRA input is the hidden size, down_proj's the intermediate size: only the first is counted.
    mlp = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
    assert components.cpu_heap_extra_bytes(llama, 255, 4, False, mlp) == int(
        components.CPU_HEAP_EXTRA * 32 * 255 * (hidden_size_bytes + 4096 * 4 + kv_bytes)
    )
    # The CPU plan carries it (8 logit tokens: one chunk on either device); a GPU's does not.
    for tokens in (255, 256, 1024):
        on_gpu = components.activation_bytes(llama, 1, tokens, 8, 4, False, ATTENTION, "cuda")
        on_cpu = components.activation_bytes(llama, 1, tokens, 8, 4, False, ATTENTION, "cpu")
        expected = int(on_gpu * components.CPU_ACTIVATION_OVERHEAD) + components.CPU_STEP_WORKING_BYTES
        assert on_cpu == expected + components.cpu_heap_extra_bytes(llama, tokens, 4, False, ATTENTION)


def test_soft_capped_logits_are_planned_whole():
    # Gemma 2 caps its logits after the head, so the trainer takes the plain path: every row of logits at once.
    gemma = shape("Gemma-2-9B")
    assert gemma.scaled_logits and not shape("Qwen2.5-7B").scaled_logits
    assert components.logprob_bytes(gemma, 4 * 512, 2) == components.LOGITS_COPIES_IN_TRAINING * 4 * 512 * 256000 * 4


def test_gradient_checkpointing_keeps_one_hidden_state_per_layer():
    qwen = shape("Qwen2.5-7B")
    full = components.activation_bytes(qwen, 8, 1024, 512, 2, False, ATTENTION)
    checkpointed = components.activation_bytes(qwen, 8, 1024, 512, 2, True, ATTENTION)
    logits = components.logprob_bytes(qwen, 8 * 512, 2)
    layer_inputs = 28 * 3584 * 2 * 8 * 1024
    assert checkpointed - logits > layer_inputs
    assert (full - logits) / (checkpointed - logits) > 5


def test_layer_activations_scale_linearly_with_the_micro_batch():
    qwen = shape("Qwen2.5-7B")
    one = components.activation_bytes(qwen, 1, 1024, 512, 2, False, ATTENTION) - components.logprob_bytes(qwen, 512, 2)
    eight = components.activation_bytes(qwen, 8, 1024, 512, 2, False, ATTENTION) - components.logprob_bytes(
        qwen, 8 * 512, 2
    )
    assert eight == pytest.approx(8 * one, rel=1e-6)


def test_kv_cache_for_a_rollout_batch():
    qwen = shape("Qwen2.5-7B")
    assert components.kv_cache_bytes(qwen, 32, 1024, 2) == 32 * 1024 * 56 * 1024


def test_runtime_counts_one_cuda_context_per_process_and_allocator_slack():
    assert components.runtime_bytes("cuda", 3, 10 * GIB) == 3 * 800 * 2**20 + int(0.12 * 10 * GIB)
    assert components.runtime_bytes("cpu", 1, 10 * GIB) == components.CPU_RUNTIME_BYTES


@pytest.mark.model
def test_nf4_weights_match_what_bitsandbytes_allocates_for_the_bundled_model(demo_model_dir):
    """Load the bundled model in nf4 and sum the bytes of every parameter and buffer."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = json.loads((demo_model_dir / "config.json").read_text())
    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    model = AutoModelForCausalLM.from_pretrained(
        str(demo_model_dir), quantization_config=quantization, dtype=torch.float32, device_map="cpu"
    )
    allocated, seen = 0, set()  # tied lm_head and embeddings share one tensor
    for module in model.modules():
        for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                allocated += tensor.numel() * tensor.element_size()
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if state is not None:
            allocated += state.absmax.numel() * state.absmax.element_size()
    planned = components.weights_bytes(shape_from_config(config), "nf4", 4)
    assert allocated == pytest.approx(planned, rel=0.02)


def test_generation_keeps_a_logprob_per_token_not_every_steps_scores():
    # engines/step_sampler.py keeps each chosen token's logprob; output_scores kept 128 x 32 x 128k fp32 here.
    llama = shape("Llama-3.1-8B")
    without = components.generation_working_bytes(llama, 32, 100, 4, "hf", device_kind="cpu")
    kept = components.generation_working_bytes(llama, 32, 100, 4, "hf", new_tokens=128, device_kind="cpu")
    assert kept - without == 128 * 32 * 4
    assert without >= components.SAMPLING_COPIES * 32 * llama.vocab * 4  # one step's sampling tensors
    assert components.generation_working_bytes(
        llama, 32, 100, 4, "vllm", new_tokens=128
    ) == components.generation_working_bytes(llama, 32, 100, 4, "vllm")


def test_transformers_generation_on_cuda_reserves_a_fixed_part_and_a_part_per_decode_step():
    llama = shape("Llama-3.1-8B")
    on_cpu = components.generation_working_bytes(llama, 16, 64, 2, "hf", new_tokens=256, device_kind="cpu")
    on_cuda = components.generation_working_bytes(llama, 16, 64, 2, "hf", new_tokens=256, device_kind="cuda")
    assert on_cuda - on_cpu == components.HF_CUDA_GENERATE_RESERVE_BYTES + 256 * components.HF_CUDA_GENERATE_STEP_BYTES
    # What an H200 reserved above the tensors (components.py): 64, 128, 256 and 512 decode steps.
    for steps, measured_extra in ((64, 0.48e9), (128, 0.67e9), (256, 0.83e9), (512, 3.04e9)):
        assert (
            components.HF_CUDA_GENERATE_RESERVE_BYTES + steps * components.HF_CUDA_GENERATE_STEP_BYTES >= measured_extra
        )
    # vLLM reserves its own pool (its KV is planned from gpu_memory_utilization): no such term.
    assert components.generation_working_bytes(
        llama, 16, 64, 2, "vllm", 256, "cuda"
    ) == components.generation_working_bytes(llama, 16, 64, 2, "vllm", 256, "cpu")
