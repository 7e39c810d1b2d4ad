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

from appliance.errors import ApplianceError

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
    return frozen(model)


def frozen(model):
    """`model` in eval mode with every parameter frozen, and its 4-bit layers kept in their trainable layout."""
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    keep_trainable_4bit_layout(model)
    return model


# ----- a model built empty and filled part by part (FSDP-QLoRA loads each rank's shard, grpo/fsdp.py) -------


class LoadError(ApplianceError):
    """A model folder that cannot be loaded part by part; the message names the tensor."""


def empty_causal_lm(model_dir: Path, quantization: str, compute_dtype: torch.dtype):
    """The model of `model_dir` with every parameter on the meta device (no memory), its 4-bit linear layers
    already bitsandbytes' (quantized as `fill` copies each weight in, exactly as from_pretrained does).

    Buffers are real (computed from the config, e.g. the rotary frequencies): only parameters come from files.
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=compute_dtype)
    if quantization in ("nf4", "fp4"):
        from transformers.integrations.bitsandbytes import replace_with_bnb_linear

        # The head stays in the compute dtype, as from_pretrained leaves it.
        config_4bit = quantization_config(quantization, compute_dtype, shardable=True)
        replace_with_bnb_linear(model, modules_to_not_convert=["lm_head"], quantization_config=config_4bit)
    elif quantization != "none":
        raise LoadError(f"a model loaded part by part is 4-bit or unquantized, not {quantization}")
    return model


class CheckpointTensors:
    """The tensors of a model folder's safetensors files, read one at a time by name (never all at once)."""

    def __init__(self, model_dir: Path):
        import json

        from safetensors import safe_open

        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            files = {name: model_dir / file for name, file in json.loads(index.read_text())["weight_map"].items()}
        else:
            single = model_dir / "model.safetensors"
            with safe_open(str(single), "pt") as handle:
                files = dict.fromkeys(handle.keys(), single)
        self.files = files

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def read(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.files[name]), "pt") as handle:
            return handle.get_tensor(name)


def fill(module: torch.nn.Module, prefix: str, tensors: CheckpointTensors, dtype: torch.dtype, device: str) -> None:
    """Give every meta parameter of `module` its tensor `prefix + name` from the checkpoint, on `device`.

    A bitsandbytes 4-bit weight is quantized as it lands, from the compute-dtype tensor, as from_pretrained does.
    Tensors the checkpoint does not hold (a head tied to the embeddings) stay on meta for the caller to tie.
    """
    import bitsandbytes as bnb

    for name, parameter in list(module.named_parameters()):
        key = prefix + name
        if parameter.device.type != "meta" or key not in tensors:
            continue
        value = tensors.read(key).to(dtype)
        if isinstance(parameter, bnb.nn.Params4bit):
            filled = bnb.nn.Params4bit(value, requires_grad=False, **parameter.__dict__).to(device)
        else:
            filled = torch.nn.Parameter(value.to(device), requires_grad=False)
        owner, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(owner) if owner else module, leaf, filled)


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
