"""A faster rollout copy of the student: dequantized base weights with the LoRA merged in.

Generating through bitsandbytes 4-bit layers dequantizes every weight at every
token; a plain copy in the compute dtype skips that at the cost of holding the
weights again (the budget manager decides: `rollout_weights: merged_copy`).
The copy's base weights are the *dequantized 4-bit* weights, not the original
checkpoint, so it samples from exactly the policy the trainer optimizes; a bf16 copy of an fp32 student
(`engine.rollout_dtype`) samples from that policy rounded to bf16, and the trainer corrects the gap with
truncated importance sampling, as for vLLM.
After each optimizer step `update_adapter` rewrites the LoRA target weights
as W = dequant(W4) + scale * B @ A from the trainer's in-memory adapter, one
layer at a time from the student's own 4-bit base: no fp32 copy of the targets
is kept between steps (only one target's fp32 weight and delta while it merges).
The embeddings (and an untied LM head), which bitsandbytes leaves in the compute
dtype and LoRA does not train, are the student's own tensors, not copies. The
other way round, the 4-bit linear layers LoRA does not wrap (a Llama's MLP under
q/k/v/o) are dequantized once, here, and the student trains through the copy's
tensors (`DequantizedLinear`): the same weights, without dequantizing them again
at every forward and backward, and without keeping their 4-bit form as well.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (before transformers: no network lookups)

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from appliance.engines.hf import HFEngine


def _dequantized(module) -> torch.Tensor:
    import bitsandbytes.functional as bnb_functional

    weight = module.weight
    # Only bitsandbytes' 4-bit parameters carry a quant_state; anything else is already plain.
    if getattr(weight, "quant_state", None) is not None:
        return bnb_functional.dequantize_4bit(weight.data, weight.quant_state).float()
    return weight.data.float()


# A slot of the copy holding a tensor the student uses too: (module._parameters, name).
Slot = tuple[dict, str]


class DequantizedLinear(torch.nn.Module):
    """In the student, a frozen 4-bit linear layer replaced by the merged copy's dequantized weight (and bias).

    The input is cast to the weight's dtype and the output back, as bitsandbytes' Linear4bit does.
    """

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter | None):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


def _share_linears(student_root, copy, names: list[str]) -> list[Slot]:
    """Replace the student's 4-bit linear layers `names` by the copy's dequantized weights (the same tensors)."""
    slots = []
    for name in names:
        parent, child = name.rsplit(".", 1) if "." in name else ("", name)
        mine = copy.get_submodule(name)
        setattr(student_root.get_submodule(parent), child, DequantizedLinear(mine.weight, mine.bias))
        slots.extend((mine._parameters, key) for key in ("weight", "bias") if mine._parameters.get(key) is not None)
    return slots


def _share_embeddings(copy, student_base) -> list[Slot]:
    """Point the copy's input embeddings and LM head at the student's where they are the same plain tensor.

    Returns the slots now holding the student's tensors, which the copy must never move (see `_without`). A
    head that bitsandbytes quantized, or any mismatch of shape, dtype or device, keeps the copy's own.
    """
    shared = []
    for get in ("get_input_embeddings", "get_output_embeddings"):
        mine, theirs = getattr(copy, get)(), getattr(student_base, get)()
        if mine is None or theirs is None:
            continue
        source = theirs.weight
        if getattr(source, "quant_state", None) is not None or not isinstance(source, torch.nn.Parameter):
            continue
        if (source.shape, source.dtype, source.device) != (mine.weight.shape, mine.weight.dtype, mine.weight.device):
            continue
        mine.weight = source
        shared.append((mine._parameters, "weight"))
    return shared


@contextmanager
def _without(slots: list[Slot]) -> Iterator[None]:
    """The slots emptied for the duration: `module.to()` moves a shared parameter in place, the student's too."""
    held = [parameters[name] for parameters, name in slots]
    for parameters, name in slots:
        parameters[name] = None
    try:
        yield
    finally:
        for (parameters, name), parameter in zip(slots, held):
            parameters[name] = parameter


class MergedCopyEngine(HFEngine):
    """Owns a separate model; keeps it in step with the student's adapter."""

    def __init__(self, student, model_dir: Path, name: str, max_batch_size: int = 64, dtype: torch.dtype | None = None):
        """dtype: the copy's (engine.rollout_dtype); the student's compute dtype by default. In another dtype
        the copy shares nothing with the student, which keeps training in its own."""
        from peft.tuners.lora import LoraLayer
        from transformers import AutoModelForCausalLM

        dtype = dtype or student.compute_dtype
        # In another dtype the copy samples from a rounded policy: the trainer then corrects by importance weights.
        self.samples_like_trainer = dtype == student.compute_dtype
        copy = AutoModelForCausalLM.from_pretrained(
            str(model_dir), local_files_only=True, dtype=dtype, device_map={"": student.device}
        )
        copy.eval()
        copy.requires_grad_(False)
        self.source_model = student.model  # the student whose base each update re-merges from
        student_root = student.model.get_base_model()  # the transformers model inside peft's wrapper
        self._shared = _share_embeddings(copy, student_root)
        self._lora_layers: dict[str, LoraLayer] = {}
        copy_modules = dict(copy.named_modules())
        frozen = []
        for name, module in student_root.named_modules():
            base = getattr(module, "base_layer", None)
            if isinstance(module, LoraLayer) and base is not None:
                self._lora_layers[name] = module
            elif name in copy_modules and getattr(getattr(module, "weight", None), "quant_state", None) is not None:
                # The dequantized 4-bit weight, not the checkpoint's: the copy must sample the policy the trainer
                # optimizes, whose base is what 4-bit quantization kept.
                copy_modules[name].weight.data.copy_(_dequantized(module).to(copy_modules[name].weight.dtype))
                frozen.append(name)
        # FSDP shards the student's own 4-bit layers (grpo/fsdp.py); a copy in another dtype would change the
        # precision the student trains in.
        if not student.shardable and self.samples_like_trainer:
            self._shared += _share_linears(student_root, copy, frozen)
        self._copy_modules = copy_modules
        super().__init__(copy, student.tokenizer, name, max_batch_size, owns_weights=True)
        self.update_adapter(None, 0)  # the targets still hold the checkpoint's weights until the first merge

    @torch.no_grad()
    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        """Merge the student's current (in-memory) adapter into the copy's target weights (awake: on the device).

        Each target is dequantized from the student's 4-bit base where it lives (the trainer's device) and the
        merged weight copied to the copy's device.
        """
        self.wake()
        # One target at a time: at most one fp32 weight and its delta are alive (components.merge_working_bytes).
        for name, layer in self._lora_layers.items():
            merged = _dequantized(layer.get_base_layer())
            for adapter in layer.active_adapters:
                merged += layer.get_delta_weight(adapter).float()
            target = self._copy_modules[name].weight
            target.copy_(merged.to(device=target.device, dtype=target.dtype))
            del merged
        self.adapter_version = version

    # Sleeping moves the copy off the device; the slots it shares with the student are emptied first so the
    # student's own tensors stay where the trainer uses them.
    def sleep(self) -> None:
        with _without(self._shared):
            super().sleep()

    def wake(self) -> None:
        with _without(self._shared):
            super().wake()
