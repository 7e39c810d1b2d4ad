"""The activation model against what autograd really saves, on the CPU, for a Llama-shaped nf4 + LoRA student.

The CUDA activation arithmetic (components._saved_per_token_per_layer) was
calibrated from one H100 shape (test_cuda_calibration.py). What a layer keeps
for backward does not depend on the device (bitsandbytes' 4-bit matmul keeps
only its packed weight on both; peft's fp32 cast and the RMSNorm's fp32 upcast
are the same code), so it is counted here, exactly, with
torch.autograd.graph.saved_tensors_hooks around the trainer's own Student
forward, in bf16 and in fp32.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from appliance.budget import components
from appliance.budget.shapes import shape_from_config
from appliance.config.schema import StudentSpec
from appliance.grpo.student import Student, TokenBatch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, LAYERS = 256, 896, 8, 2, 3
BATCH, PROMPT, COMPLETION = 2, 24, 8


def tiny_llama(source, target):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        tie_word_embeddings=False,
        pad_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, target / name)
    return config.to_dict()


def saved_bytes_per_layer(student: Student, rows: int = BATCH, group_size: int = 1) -> dict[int, int]:
    """Bytes of the distinct tensors each decoder layer saves for backward (parameters and buffers excluded),
    over `rows` sequences whose groups of `group_size` share a prompt (its forward and the completions' both
    count to the layer)."""
    layers = student.model.base_model.model.model.layers
    current, saved = {"layer": None}, {}
    own = {t.untyped_storage().data_ptr() for t in list(student.model.parameters()) + list(student.model.buffers())}
    for index, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda module, args, index=index: current.update(layer=index))
        layer.register_forward_hook(lambda module, args, output: current.update(layer=None))

    def pack(tensor):
        storage = tensor.untyped_storage()
        if current["layer"] is not None and storage.data_ptr() not in own:
            saved.setdefault(current["layer"], {})[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(10, 1000, (rows, PROMPT + COMPLETION))
    ids[:, :PROMPT] = ids[torch.arange(rows) // group_size, :PROMPT]  # groups of `group_size` share a prompt
    attention = torch.ones_like(ids)
    if group_size > 1:  # the first group's prompt one token shorter, left-padded: the prompt pass has a mask
        attention[:group_size, 0] = 0
    batch = TokenBatch(ids, attention, ids[:, PROMPT:], torch.ones(rows, COMPLETION, dtype=torch.long))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        student.completion_logprobs(batch, 1.0, train=True).sum().backward()
    return {index: sum(storages.values()) for index, storages in saved.items()}


def tiny_student(dtype: str, demo_model_dir, tmp_path) -> tuple[Student, dict]:
    config = tiny_llama(demo_model_dir, tmp_path)
    spec = StudentSpec.model_validate(
        {
            "model": str(tmp_path),
            "quantization": "nf4",
            "compute_dtype": dtype,
            "lora": {"rank": 16, "alpha": 32, "target_modules": TARGETS},
        }
    )
    return Student(spec, tmp_path, "cpu"), config


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_saved_tensors_match_the_activation_model(dtype, demo_model_dir, tmp_path):
    student, config = tiny_student(dtype, demo_model_dir, tmp_path)
    per_layer = saved_bytes_per_layer(student)
    tokens = BATCH * (PROMPT + COMPLETION)
    planned = components._saved_per_token_per_layer(shape_from_config(config), TARGETS, 4 if dtype == "float32" else 2)
    # Layer 0's input is the frozen embedding (nothing needs its gradient), so it keeps less: compare the others.
    for index in range(1, LAYERS):
        # The model leaves out only small tensors: the softmax log-sum-exp, rank-16 LoRA activations, RoPE tables.
        assert per_layer[index] / tokens == pytest.approx(planned, rel=0.05), (index, per_layer)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_saved_tensors_of_shared_prompts_match_the_activation_model(
    dtype, packed, demo_model_dir, tmp_path, monkeypatch
):
    """8 rows in 2 groups: each prompt runs once, so its positions are saved twice, not 8 times, packed with its
    completions into one sequence of 24 + 4 x 8 tokens or in a pass of its own. One prompt is padded, as
    prompts of different lengths are: the planner counts the prompts' keys repeated to every head, as attention
    with a mask keeps them (an unpadded prompt pass keeps them at kv_heads)."""
    if not packed:
        monkeypatch.setattr(components, "PACKED_SEQUENCE_TOKENS", PROMPT + 4 * COMPLETION - 1)
    student, config = tiny_student(dtype, demo_model_dir, tmp_path)
    rows, group_size = 8, 4
    per_layer = saved_bytes_per_layer(student, rows, group_size)
    shape, dtype_bytes = shape_from_config(config), 4 if dtype == "float32" else 2
    prompts = components.prompt_rows_per_micro_batch(rows, group_size)
    assert prompts == 2
    assert components.packs_prompts(PROMPT, COMPLETION, group_size) == packed
    shared = components.saved_per_layer_bytes(
        shape, rows, PROMPT + COMPLETION, TARGETS, dtype_bytes, (prompts * PROMPT, rows * COMPLETION), packed
    )
    whole = components.saved_per_layer_bytes(shape, rows, PROMPT + COMPLETION, TARGETS, dtype_bytes)
    assert shared < 0.6 * whole
    for index in range(1, LAYERS):
        assert per_layer[index] == pytest.approx(shared, rel=0.05), (index, per_layer, shared)


@pytest.mark.parametrize(
    ("micro_batch", "group_size", "rows"),
    [(16, 8, 2), (8, 4, 2), (12, 8, 2), (4, 8, 1), (5, 8, 2), (32, 8, 4), (3, 2, 3), (8, 1, 8), (6, 4, 2), (7, 4, 3)],
)
def test_the_prompts_a_micro_batch_of_whole_groups_can_hold(micro_batch, group_size, rows):
    """Every start at a multiple of the micro-batch, over samples in whole groups: the most distinct prompts
    any micro-batch holds, or the micro-batch itself where the update runs them whole (over half the rows)."""
    most = 0
    for start in range(0, micro_batch * group_size * 4, micro_batch):
        most = max(most, len({index // group_size for index in range(start, start + micro_batch)}))
    assert components.prompt_rows_per_micro_batch(micro_batch, group_size) == (
        most if 2 * most <= micro_batch else micro_batch
    )
    assert components.prompt_rows_per_micro_batch(micro_batch, group_size) == rows
