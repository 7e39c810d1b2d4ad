"""Bytes per memory component (DESIGN.md names), from a ModelShape and plain numbers.

Each function is one component's arithmetic; plan.py decides which of them are
resident in which phase. Formulas follow how the libraries we use store
things: bitsandbytes 4-bit packs two weights per byte with one fp32 absmax per
block of 64 (double quantization stores that absmax in 8 bits with an fp32
constant per 256 blocks), keeps biases, embeddings, norms and lm_head in the
compute dtype; peft LoRA parameters and their gradients are fp32; AdamW keeps
two states per trainable parameter.

Pure arithmetic: nothing here reads a device, a file or the clock. The fitted
constants say at their line which bench/README.md section holds their runs.
"""

from __future__ import annotations

import math

from appliance.budget.host_allocator import MMAP_THRESHOLD_BYTES  # the threshold the trainer pins
from appliance.budget.shapes import ModelShape, ShapeError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4
# bitsandbytes' defaults: one absmax per 64 weights, and under double quantization one fp32 constant per 256
# absmax blocks.
QUANT_BLOCKSIZE = 64
DOUBLE_QUANT_BLOCKSIZE = 256

# The CPU process's own cost, in three parts measured apart on the bundled model: bench/README.md,
# "Figures behind constants in the code", "The CPU runtime". First, the RSS of a Python process that imported
# torch, transformers, peft and bitsandbytes ...
CPU_LIBRARIES_BYTES = 450 * 2**20
# ... plus what from_pretrained leaves resident besides the weights (mapped safetensors pages, allocator
# arenas) ...
CPU_LOAD_RESIDUE_BYTES = 320 * 2**20
# ... plus what the first forward pass through bitsandbytes' CPU path and oneDNN keeps for the life of the
# process.
CPU_FIRST_USE_BYTES = 280 * 2**20
CPU_RUNTIME_BYTES = CPU_LIBRARIES_BYTES + CPU_LOAD_RESIDUE_BYTES + CPU_FIRST_USE_BYTES
# CUDA context, cuBLAS workspaces and kernels of one process on the GPU: nvidia-smi's peak less torch's
# max_memory_reserved, the same in all four CUDA runs (bench/README.md, "On CUDA again: an H200"), rounded up.
CUDA_CONTEXT_BYTES = 800 * 2**20
# What the caching allocator holds beyond the plan's tensors, as a fraction of everything else in a phase:
# the train phase reserves more from the second step on, and this is the smallest round slack that covers
# both rollout modes' nvidia-smi peaks (bench/README.md, "On CUDA again: an H200").
CUDA_ALLOCATOR_SLACK = 0.12

# vLLM's default max_num_batched_tokens with chunked prefill: tokens per forward pass.
VLLM_MAX_BATCHED_TOKENS = 8192

# AdamW's two states per trainable parameter: fp32 each, or one byte each in bitsandbytes' paged 8-bit form.
OPTIMIZER_BYTES_PER_PARAM = {"adamw_32bit": 2 * 4, "paged_adamw_8bit": 2 * 1}

# The trainer computes the sampled tokens' logprobs a chunk of tokens at a time (grpo/student.py):
# at most this many bytes of fp32 logits per chunk, by device kind. On a GPU the larger chunk keeps each
# chunk's matmul large (hundreds of tokens of Qwen's 152k vocabulary); on the CPU the smaller one took the same
# time and keeps less of the update resident (bench/README.md, "memory_plan.py", "heap-served tensors") ...
LOGIT_CHUNK_BYTES = {"cpu": 32 * 2**20, "cuda": 256 * 2**20}
# ... of which this many chunk-sized tensors are alive at once (backward: the recomputed logits, under a
# 16-bit head also their fp32 cast, the softmax and the logits' gradient).
LOGIT_CHUNK_COPIES = 4
# Models whose logits are not a plain linear head (ModelShape.scaled_logits) materialise them whole: at
# the loss the logits, their fp32 log-softmax, the gradient of the log-probs and of the logits.
LOGITS_COPIES_IN_TRAINING = 4
# On the CPU a step's tensors cost more than autograd keeps: bitsandbytes' CPU path dequantizes each weight
# into temporaries in forward and again in backward, oneDNN keeps scratch buffers, and tensors under glibc's
# mmap threshold (pinned by the trainer, budget/host_allocator.py) stay in its heap. So the plan is a factor
# on the tensor arithmetic plus a fixed working set, fitted on whole jobs: the factor from the jobs with the
# most tensors, the working set from the smallest update (bench/README.md, "memory_plan.py", "re-fitted CPU
# constants"). A single larger factor over-planned the large jobs.
CPU_ACTIVATION_OVERHEAD = 1.12
CPU_STEP_WORKING_BYTES = 280 * 2**20
# Saved tensors of the hidden size (the residual stream: norm inputs, q, the attention output, LoRA inputs)
# and of the k/v size under glibc's mmap threshold come from its heap, and at the update's peak they cost this
# much more than their bytes. The factor holds the largest excess of the jobs it was fitted on; the SwiGLU
# tensors showed no such excess and are not counted (bench/README.md, "memory_plan.py", "heap-served tensors";
# "Figures behind constants in the code", "The heap term").
CPU_HEAP_EXTRA = 1.4
# A checkpointed update on the CPU needs this much more, whatever its size: the recomputation's temporaries
# (each layer's 4-bit weights dequantized again, its forward rebuilt) come and go from the heap. Fitted beside
# the older, smaller step working set; raised with it, this value keeps the sum it was fitted as
# (bench/README.md, "memory_plan.py", "re-fitted CPU constants").
CPU_CHECKPOINTING_WORKING_BYTES = 300 * 2**20


def weights_bytes(shape: ModelShape, quantization: str, dtype_bytes: int, double_quant: bool = False) -> int:
    """A model's weights on the device: nf4/fp4 (4-bit), int8, or none (all in the compute dtype)."""
    unquantized = shape.unquantized_params * dtype_bytes
    if quantization == "none":
        return shape.total_params * dtype_bytes
    if quantization in ("nf4", "fp4"):
        return four_bit_bytes(shape.linear_params, double_quant) + unquantized
    if quantization == "int8":
        rows = shape.layers * sum(out for _, _, out in shape.block_linears)
        return linear_weight_bytes(shape, quantization, dtype_bytes) + rows * FP32 + unquantized
    raise ValueError(f"unknown quantization '{quantization}' (expected nf4, fp4, int8 or none)")


def four_bit_bytes(params: int, double_quant: bool = False) -> int:
    """`params` weights in bitsandbytes' 4-bit storage: two a byte, plus each block's quantization constant."""
    blocks = -(-params // QUANT_BLOCKSIZE)
    constants = blocks * 1 + -(-blocks // DOUBLE_QUANT_BLOCKSIZE) * FP32 if double_quant else blocks * FP32
    return (params + 1) // 2 + constants


def untargeted_linear_params(shape: ModelShape, target_modules: list[str]) -> int:
    """Weights of the decoder layers' linear layers that LoRA does not wrap (a Llama's MLP under q/k/v/o)."""
    return shape.linear_params - shape.layers * sum(_target_sizes(shape, target_modules))


def linear_weight_bytes(shape: ModelShape, quantization: str, dtype_bytes: int) -> int:
    """The decoder layers' linear weights alone, as stored (without quantization constants)."""
    if quantization in ("nf4", "fp4"):
        return (shape.linear_params + 1) // 2
    return shape.linear_params * (1 if quantization == "int8" else dtype_bytes)


def sharded_weights_bytes(
    shape: ModelShape, quantization: str, dtype_bytes: int, double_quant: bool = False, shards: int = 1
) -> int:
    """One rank's weights: all of them (shards=1), or under FSDP (grpo/fsdp.py) its shard of the decoder layers'
    linear weights plus one layer's gathered whole for the forward and backward, with the embeddings, head, norms
    and 4-bit quantization constants whole on every rank (FSDP-QLoRA stores the 4-bit weights in the compute
    dtype's storage: the same bytes)."""
    whole = weights_bytes(shape, quantization, dtype_bytes, double_quant)
    if shards <= 1:
        return whole
    sharded = linear_weight_bytes(shape, quantization, dtype_bytes)
    return whole - sharded + -(-sharded // shards) + -(-sharded // shape.layers)


def lora_params(shape: ModelShape, rank: int, target_modules: list[str]) -> int:
    """Adapter parameters: rank x (in + out) for each targeted linear layer of every block."""
    linears = {name: (i, o) for name, i, o in shape.block_linears}
    targets = list(linears) if list(target_modules) == ["all-linear"] else list(target_modules)
    unknown = [t for t in targets if t not in linears]
    if unknown:
        raise ShapeError(
            f"student.lora.target_modules: {', '.join(unknown)} is not a linear layer of {shape.name} "
            f"(it has {', '.join(linears)}, or write all-linear)"
        )
    return shape.layers * sum(rank * (linears[t][0] + linears[t][1]) for t in targets)


def _target_sizes(shape: ModelShape, target_modules: list[str]) -> list[int]:
    linears = {name: (i, o) for name, i, o in shape.block_linears}
    targets = list(linears) if list(target_modules) == ["all-linear"] else [t for t in target_modules if t in linears]
    return [linears[t][0] * linears[t][1] for t in targets]


def merge_working_bytes(shape: ModelShape, target_modules: list[str]) -> int:
    """The merged rollout copy's re-merge working memory: the largest target's fp32 dequantized weight and
    its fp32 LoRA delta, one layer at a time (engines/merged_copy.py)."""
    return 2 * FP32 * max(_target_sizes(shape, target_modules), default=0)


def student_lora_bytes(trainable_params: int) -> int:
    """fp32 adapter parameters and their gradients."""
    return trainable_params * (FP32 + FP32)


def optimizer_bytes(trainable_params: int, optimizer: str = "adamw_32bit") -> int:
    return trainable_params * OPTIMIZER_BYTES_PER_PARAM[optimizer]


def _lora_input_bytes(shape: ModelShape, lora_targets: list[str], dtype_bytes: int) -> int:
    """Bytes per token one layer's LoRA adapters keep of their inputs for the adapter's gradient.

    The adapters are fp32 (student.py), and peft casts each targeted layer's input
    to fp32 before lora_A: under a 16-bit compute dtype every targeted module keeps
    its own fp32 copy (q, k and v three copies of the same norm output); under fp32
    the cast is a no-op and modules sharing an input share one tensor.
    """
    linears = {name: i for name, i, _ in shape.block_linears}
    targets = set(linears) if "all-linear" in lora_targets else set(lora_targets) & set(linears)
    if dtype_bytes != FP32:
        return sum(linears[t] for t in targets) * FP32
    groups = ({"q_proj", "k_proj", "v_proj"}, {"o_proj"}, {"gate_proj", "up_proj"}, {"down_proj"})
    return sum(linears[next(iter(group))] for group in groups if group & targets) * FP32


def _saved_per_token_per_layer(shape: ModelShape, lora_targets: list[str], dtype_bytes: int) -> int:
    """Bytes one decoder layer keeps for backward per token (frozen 4-bit base, SDPA attention).

    Counted from what autograd saves (torch.autograd.graph.saved_tensors_hooks on a
    Llama-shaped nf4 + LoRA student, transformers 5.19, bf16 and fp32; see
    tests/budget/test_cuda_calibration.py): the two RMSNorm inputs, upcast to fp32
    inside the norm; q and k after RoPE, v and the attention output (k and v at
    kv_heads: SDPA handles grouped-query attention without repeating them); the
    gated MLP's gate and up, and its activated gate unless grpo/student.py rebuilds it
    (SiLU); the LoRA inputs (_lora_input_bytes). A frozen
    4-bit linear keeps no input (bitsandbytes keeps only its packed weight).
    """
    return _saved_per_query_per_layer(shape, lora_targets, dtype_bytes) + _saved_per_key_per_layer(shape, dtype_bytes)


def _saved_per_query_per_layer(shape: ModelShape, lora_targets: list[str], dtype_bytes: int) -> int:
    """The part of `_saved_per_token_per_layer` a token keeps for the position it computes: all but k and v."""
    h, i = shape.hidden, shape.intermediate
    q = shape.heads * shape.head_dim
    gate_tensors = 2 if shape.silu_gate else 3  # gate and up, and the activated gate unless it is rebuilt
    return (
        2 * h * FP32
        + 2 * q * dtype_bytes
        + gate_tensors * i * dtype_bytes
        + _lora_input_bytes(shape, lora_targets, dtype_bytes)
    )


def _saved_per_key_per_layer(shape: ModelShape, dtype_bytes: int, masked: bool = False) -> int:
    """The part a token keeps as a key: k after RoPE and v, as attention's inputs. `masked`: attention with a
    mask, where transformers repeats k and v to every query head before SDPA (grouped-query attention only
    reaches SDPA without a mask); completions running on a cache always have one."""
    heads = shape.heads if masked else shape.kv_heads
    return 2 * heads * shape.head_dim * dtype_bytes


def _heap_served_per_token_per_layer(shape: ModelShape, tokens: int, lora_targets: list[str], dtype_bytes: int) -> int:
    """Bytes per token of one layer's saved tensors that glibc's heap serves in a `tokens`-token micro-batch:
    the [tokens, hidden]-wide ones (the norm inputs, q and the attention output, the LoRA inputs but
    down_proj's) and k and v, each group when one of its tensors is under the mmap threshold."""
    lora = _lora_input_bytes(shape, lora_targets, dtype_bytes)
    if "down_proj" in lora_targets or "all-linear" in lora_targets:
        lora -= _lora_input_bytes(shape, ["down_proj"], dtype_bytes)
    kv_width = shape.kv_heads * shape.head_dim
    served = 0
    if tokens * shape.hidden * dtype_bytes < MMAP_THRESHOLD_BYTES:
        served += 2 * shape.hidden * FP32 + 2 * shape.heads * shape.head_dim * dtype_bytes + lora
    if tokens * kv_width * dtype_bytes < MMAP_THRESHOLD_BYTES:
        served += 2 * kv_width * dtype_bytes
    return served


def cpu_heap_extra_bytes(
    shape: ModelShape, tokens: int, dtype_bytes: int, gradient_checkpointing: bool, lora_targets: list[str]
) -> int:
    """What the heap-served saved tensors of a `tokens`-token micro-batch cost on the CPU beyond their bytes
    (CPU_HEAP_EXTRA); 0 once each is past glibc's mmap threshold."""
    layers_kept = 1 if gradient_checkpointing else shape.layers
    per_layer = _heap_served_per_token_per_layer(shape, tokens, lora_targets, dtype_bytes) * tokens
    inputs = 0
    if gradient_checkpointing and tokens * shape.hidden * dtype_bytes < MMAP_THRESHOLD_BYTES:
        inputs = shape.layers * shape.hidden * dtype_bytes * tokens
    return int(CPU_HEAP_EXTRA * (layers_kept * per_layer + inputs))


def logit_chunk_bytes(device_kind: str) -> int:
    """fp32 logits per logprob chunk on this kind of device (a device other than the CPU: the GPU's size)."""
    return LOGIT_CHUNK_BYTES.get(device_kind, LOGIT_CHUNK_BYTES["cuda"])


def logit_chunk_tokens(vocab: int, chunk_bytes: int = LOGIT_CHUNK_BYTES["cuda"]) -> int:
    """Tokens per logprob chunk: one chunk's fp32 logits within `chunk_bytes`."""
    return max(1, chunk_bytes // (vocab * FP32))


def logprob_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, device_kind: str = "cuda") -> int:
    """The loss's working memory for `tokens` logprobs: chunks of logits, or the whole logits where it must.

    Besides the chunk the head keeps its input and gets that input's gradient ([tokens, hidden] each).
    """
    if shape.scaled_logits:
        return LOGITS_COPIES_IN_TRAINING * tokens * shape.vocab * FP32
    chunk_tokens = logit_chunk_tokens(shape.vocab, logit_chunk_bytes(device_kind))
    chunk = LOGIT_CHUNK_COPIES * min(tokens, chunk_tokens) * shape.vocab * FP32
    return chunk + 2 * tokens * shape.hidden * dtype_bytes


def saved_per_layer_bytes(
    shape: ModelShape,
    micro_batch: int,
    sequence_tokens: int,
    lora_targets: list[str],
    dtype_bytes: int,
    shared_rows: tuple[int, int] | None = None,
    packed: bool = False,
) -> int:
    """What one decoder layer saves for backward over a micro-batch of whole sequences, or, with `shared_rows`
    (the distinct prompts' tokens, the completions' tokens), one whose rows share prompts: each position is
    kept once, and the completions' attention keeps every row's whole keys and values, repeated to every
    head, besides the prompts' (counted the same way: a padded prompt batch has a mask too). `packed`: each
    prompt and its completions run as one sequence (packs_prompts), whose keys are its positions, once."""
    tokens = micro_batch * sequence_tokens
    if shared_rows is None:
        return _saved_per_token_per_layer(shape, lora_targets, dtype_bytes) * tokens
    queries = sum(shared_rows)
    keys = queries if packed else tokens + shared_rows[0]
    return (
        _saved_per_query_per_layer(shape, lora_targets, dtype_bytes) * queries
        + _saved_per_key_per_layer(shape, dtype_bytes, masked=True) * keys
    )


def shares_prompts(distinct_prompts: int, rows: int) -> bool:
    """Whether the update runs a micro-batch's distinct prompts once each (grpo/student.py): when at most half
    its rows have a prompt of their own. Past that the completions' keys and values, repeated to every head,
    could outweigh what sharing saves (each prompt saves its positions' tensors but adds its keys to every row)."""
    return 2 * distinct_prompts <= rows


# The update packs each distinct prompt and its rows' completions into one sequence, one decoder pass instead
# of a prompt pass and a completion pass (grpo/student.py), when that sequence is at most this long: its
# attention spans the whole packed sequence, which grows with its square, against the second pass it saves.
# Packing was faster up to the demo's and workload F's lengths and slower at gsm8k-cpu's (bench/README.md,
# "Figures behind constants in the code", "Packed prompts").
PACKED_SEQUENCE_TOKENS = 512


def packs_prompts(prompt_tokens: int, completion_tokens: int, rows_per_prompt: int) -> bool:
    """Whether the update runs a shared prompt and its `rows_per_prompt` completions as one packed sequence."""
    return prompt_tokens + rows_per_prompt * completion_tokens <= PACKED_SEQUENCE_TOKENS


def prompt_rows_per_micro_batch(micro_batch: int, group_size: int) -> int:
    """Distinct prompts a micro-batch of `micro_batch` consecutive samples can hold, in whole groups of
    `group_size` sharing one (the update trains every sample of an informative group). Micro-batches start at
    multiples of `micro_batch`, so one starts at most `group_size - gcd` samples into a group. `micro_batch`
    when the update would not share them (`shares_prompts`)."""
    group_size = max(1, group_size)
    furthest_start = group_size - math.gcd(micro_batch, group_size)
    rows = -(-(furthest_start + micro_batch) // group_size)
    return rows if shares_prompts(rows, micro_batch) else micro_batch


def activation_bytes(
    shape: ModelShape,
    micro_batch: int,
    sequence_tokens: int,
    logit_tokens: int,
    dtype_bytes: int,
    gradient_checkpointing: bool,
    lora_targets: list[str],
    device_kind: str = "cuda",
    prompt_rows: int | None = None,
    prompt_tokens: int = 0,
    packed: bool = False,
) -> int:
    """Peak training activations for one micro-batch, the loss's logits included.

    Without checkpointing every layer keeps its saved tensors; with it, each layer
    keeps only its input and one layer's tensors are rebuilt during backward.
    Logprobs are computed for `logit_tokens` positions per sequence (the
    completion), a chunk of them at a time (`logprob_bytes`).
    `prompt_rows`: distinct prompts of `prompt_tokens` in the micro-batch when its rows share them
    (grpo/student.py runs each prompt once and its completions on its keys and values, never under
    checkpointing): the prompt's positions are kept once per distinct prompt, while every row's attention
    keeps the whole sequence's keys and values, and the prompts' own attention theirs; `packed`: the prompts
    and their completions run as one sequence each (packs_prompts).
    """
    tokens = micro_batch * sequence_tokens
    shared = prompt_rows is not None and prompt_rows < micro_batch and prompt_tokens and not gradient_checkpointing
    rows = (prompt_rows * prompt_tokens, micro_batch * (sequence_tokens - prompt_tokens)) if shared else None
    per_layer = saved_per_layer_bytes(shape, micro_batch, sequence_tokens, lora_targets, dtype_bytes, rows, packed)
    if gradient_checkpointing:
        layers = shape.layers * shape.hidden * dtype_bytes * tokens + per_layer
    else:
        layers = shape.layers * per_layer
    logits = logprob_bytes(shape, micro_batch * logit_tokens, dtype_bytes, device_kind)
    if device_kind != "cpu":
        return layers + logits
    if shared:  # the prompts' forward and the completions' allocate apart, each at its own size, unless packed
        parts = (sum(rows),) if packed else rows
        heap = sum(cpu_heap_extra_bytes(shape, part, dtype_bytes, False, lora_targets) for part in parts)
    else:
        heap = cpu_heap_extra_bytes(shape, tokens, dtype_bytes, gradient_checkpointing, lora_targets)
    working = CPU_STEP_WORKING_BYTES + (CPU_CHECKPOINTING_WORKING_BYTES if gradient_checkpointing else 0)
    return int((layers + logits) * CPU_ACTIVATION_OVERHEAD) + heap + working


# A transformers decode step's sampling: the step's fp32 logits, the temperature's copy, top-p's sorted copy,
# its int64 indices (two) and cumulative probabilities, and the sampler's probabilities and returned scores
# (engines/step_sampler.py), at once at most.
SAMPLING_COPIES = 8


# transformers' generate on CUDA reserves more than the tensors above: freed blocks of a step's grown KV cache
# and scores that the caching allocator cannot hand to the next, larger ones. A fixed part and a part per decode
# step hold all four runs of an 8B-shaped model, the longest one exactly; longer generations are not measured
# (bench/README.md, "memory_plan.py", "The generate phase on CUDA").
HF_CUDA_GENERATE_RESERVE_BYTES = 450 * 10**6
HF_CUDA_GENERATE_STEP_BYTES = int(5.1 * 10**6)


def generation_working_bytes(
    shape: ModelShape,
    batch: int,
    prompt_tokens: int,
    dtype_bytes: int,
    engine: str = "hf",
    new_tokens: int = 0,
    device_kind: str = "cuda",
) -> int:
    """Transient memory of generation besides the KV cache.

    Both engines compute logits for the last position only (transformers sets
    `logits_to_keep=1`); a decode step's sampling holds SAMPLING_COPIES fp32
    [batch, vocab] tensors at once. Prefill runs one layer at a time: its hidden
    states, q/k/v and SwiGLU intermediates are the largest temporaries.
    transformers prefills the whole batch at once; vLLM at most
    `VLLM_MAX_BATCHED_TOKENS` per forward. Both keep only each chosen token's
    logprob (engines/step_sampler.py for transformers).
    """
    sampling = SAMPLING_COPIES * batch * shape.vocab * FP32
    tokens = batch * prompt_tokens
    if engine == "vllm":
        tokens = min(tokens, VLLM_MAX_BATCHED_TOKENS)
    prefill = tokens * (3 * shape.hidden + 3 * shape.intermediate) * dtype_bytes
    kept_scores = new_tokens * batch * FP32 if engine == "hf" else 0
    reserve = 0
    if engine == "hf" and device_kind == "cuda":
        reserve = HF_CUDA_GENERATE_RESERVE_BYTES + new_tokens * HF_CUDA_GENERATE_STEP_BYTES
    return sampling + prefill + kept_scores + reserve


def kv_cache_bytes(shape: ModelShape, sequences: int, tokens_per_sequence: int, dtype_bytes: int) -> int:
    """2 x layers x kv_heads x head_dim x dtype bytes x tokens in flight (sliding windows respected)."""
    return shape.kv_bytes(sequences, tokens_per_sequence, dtype_bytes)


def runtime_bytes(device_kind: str, processes: int, other_bytes: int) -> int:
    """What the processes themselves cost: interpreter and libraries (CPU) or CUDA contexts and allocator slack."""
    if device_kind == "cpu":
        return processes * CPU_RUNTIME_BYTES
    return processes * CUDA_CONTEXT_BYTES + int(CUDA_ALLOCATOR_SLACK * other_bytes)
