"""A faster rollout copy of the student: dequantized base weights with the LoRA merged in.

Generating through bitsandbytes 4-bit layers dequantizes every weight at every
token; a plain copy in the compute dtype skips that at the cost of holding the
weights again (the budget manager decides: `rollout_weights: merged_copy`).
The copy's base weights are the *dequantized 4-bit* weights, not the original
checkpoint, so it samples from exactly the policy the trainer optimizes.
After each optimizer step `update_adapter` rewrites the LoRA target weights
as W = dequant(W4) + scale * B @ A from the trainer's in-memory adapter.
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
        self._base_weights: dict[str, torch.Tensor] = {}
        copy_modules = dict(copy.named_modules())
        for name, module in student.model.base_model.model.named_modules():
            base = getattr(module, "base_layer", None)
            if isinstance(module, LoraLayer) and base is not None:
                self._lora_layers[name] = module
                self._base_weights[name] = _dequantized(base)
            elif name in copy_modules and getattr(getattr(module, "weight", None), "quant_state", None) is not None:
                copy_modules[name].weight.data.copy_(_dequantized(module).to(copy_modules[name].weight.dtype))
        self._copy_modules = copy_modules
        super().__init__(copy, student.tokenizer, name, max_batch_size, owns_weights=True)
        self.update_adapter(None, 0)

    def sleep(self) -> None:
        """The copy and its dequantized base weights go to host RAM together (CUDA; see HFEngine.sleep)."""
        super().sleep()
        if self._asleep_from is not None:
            self._move_base_weights("cpu")

    def wake(self) -> None:
        device = self._asleep_from
        super().wake()
        if device is not None:
            self._move_base_weights(device)

    def _move_base_weights(self, device) -> None:
        self._base_weights = {name: weight.to(device) for name, weight in self._base_weights.items()}

    @torch.no_grad()
    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        """Merge the student's current (in-memory) adapter into the copy's target weights (awake: on the device)."""
        self.wake()
        for name, layer in self._lora_layers.items():
            delta = sum(
                (layer.get_delta_weight(adapter).float() for adapter in layer.active_adapters),
                torch.zeros_like(self._base_weights[name]),
            )
            target = self._copy_modules[name].weight
            target.copy_((self._base_weights[name] + delta).to(target.dtype))
        self.adapter_version = version
