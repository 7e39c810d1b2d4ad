"""A faster rollout copy of the student: dequantized base weights with the LoRA merged in.

Generating through bitsandbytes 4-bit layers dequantizes every weight at every
token; a plain copy in the compute dtype skips that at the cost of holding the
weights again (the budget manager decides: `rollout_weights: merged_copy`).
The copy's base weights are the *dequantized 4-bit* weights, not the original
checkpoint, so it samples from exactly the policy the trainer optimizes.
After each optimizer step `update_adapter` rewrites the LoRA target weights
as W = dequant(W4) + scale * B @ A from the trainer's in-memory adapter, one
layer at a time from the student's own 4-bit base: no fp32 copy of the targets
is kept between steps (only one target's fp32 weight and delta while it merges).
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

from pathlib import Path

import torch

from appliance.engines.hf import HFEngine


def _dequantized(module) -> torch.Tensor:
    import bitsandbytes.functional as bnb_functional

    weight = module.weight
    if getattr(weight, "quant_state", None) is not None:
        return bnb_functional.dequantize_4bit(weight.data, weight.quant_state).float()
    return weight.data.float()


class MergedCopyEngine(HFEngine):
    """Owns a separate model; keeps it in step with the student's adapter."""

    def __init__(self, student, model_dir: Path, name: str, max_batch_size: int = 64):
        from peft.tuners.lora import LoraLayer
        from transformers import AutoModelForCausalLM

        copy = AutoModelForCausalLM.from_pretrained(
            str(model_dir), local_files_only=True, dtype=student.compute_dtype, device_map={"": student.device}
        )
        copy.eval()
        copy.requires_grad_(False)
        self._student_model = student.model
        self._lora_layers: dict[str, LoraLayer] = {}
        copy_modules = dict(copy.named_modules())
        for name, module in student.model.base_model.model.named_modules():
            base = getattr(module, "base_layer", None)
            if isinstance(module, LoraLayer) and base is not None:
                self._lora_layers[name] = module
            elif name in copy_modules and getattr(getattr(module, "weight", None), "quant_state", None) is not None:
                copy_modules[name].weight.data.copy_(_dequantized(module).to(copy_modules[name].weight.dtype))
        self._copy_modules = copy_modules
        super().__init__(copy, student.tokenizer, name, max_batch_size, owns_weights=True)
        self.update_adapter(None, 0)

    @torch.no_grad()
    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        """Merge the student's current (in-memory) adapter into the copy's target weights (awake: on the device).

        Each target is dequantized from the student's 4-bit base where it lives (the trainer's device) and the
        merged weight copied to the copy's device.
        """
        self.wake()
        for name, layer in self._lora_layers.items():
            merged = _dequantized(layer.get_base_layer())
            for adapter in layer.active_adapters:
                merged += layer.get_delta_weight(adapter).float()
            target = self._copy_modules[name].weight
            target.copy_(merged.to(device=target.device, dtype=target.dtype))
            del merged
        self.adapter_version = version
