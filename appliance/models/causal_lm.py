"""Load a causal LM and its tokenizer from a local folder, quantized as the job asks.

Quantization is bitsandbytes (NF4/FP4 4-bit, int8) or none. The compute dtype
follows the device: bf16 on CUDA, fp32 on the CPU, where bf16 without hardware
support is many times slower (bench/README.md, "Figures behind constants in the
code", "bf16 on the CPU").

It only reads the model folder (local files, never the network) and returns frozen
weights; making them trainable is the trainer's job.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (before transformers: no network lookups)

from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_compute_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return DTYPES[name]


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    tokenizer.padding_side = "left"  # generation continues from the last column of every row
    if tokenizer.pad_token_id is None:
        # Padding is masked out wherever it is used, so any token serves; EOS is always there.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def quantization_config(quantization: str, compute_dtype: torch.dtype, shardable: bool = False):
    """shardable: 4-bit weights packed in the compute dtype's storage, which FSDP can shard (FSDP-QLoRA)."""
    from transformers import BitsAndBytesConfig

    if quantization in ("nf4", "fp4"):
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quantization,
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_use_double_quant=False,
            # FSDP shards tensors of one dtype: packed 4-bit words stored as the compute dtype shard with the rest.
            bnb_4bit_quant_storage=compute_dtype if shardable else torch.uint8,
        )
    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def load_causal_lm(
    model_dir: Path,
    quantization: str = "none",
    compute_dtype: torch.dtype = torch.float32,
    device: str | None = None,
    shardable: bool = False,
):
    """A frozen model in eval mode on `device` (every parameter requires_grad False)."""
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir),
        local_files_only=True,
        dtype=compute_dtype,
        quantization_config=quantization_config(quantization, compute_dtype, shardable),
        device_map={"": device},  # the whole model on one device: a rank never spreads layers over devices
    )
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    keep_trainable_4bit_layout(model)
    return model


def keep_trainable_4bit_layout(model) -> None:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel.

    On CPUs with AVX512-BF16, bitsandbytes 0.50 converts a Linear4bit's weights
    in place the first time it runs in eval mode without gradients (bf16 absmax,
    a kernel without autograd). Generation would then change the weights the
    trainer backpropagates through; keep the one training-capable layout.
    """
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:  # without bitsandbytes there is no 4-bit layer to protect
        return
    for module in model.modules():
        if isinstance(module, Linear4bit):
            module.support_avx512bf16_for_cpu = False
