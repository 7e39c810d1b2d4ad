"""Optimizer and learning-rate schedule for the LoRA parameters.

AdamW: bitsandbytes paged 8-bit on CUDA (less memory, spills to host under
pressure), torch AdamW on the CPU. Schedule: linear warmup, then constant or
cosine decay to zero at the last step.
"""

from __future__ import annotations

import math

import torch

from appliance.config.schema import GrpoSpec


def make_optimizer(parameters, spec: GrpoSpec, device: str) -> torch.optim.Optimizer:
    if device.startswith("cuda"):
        import bitsandbytes as bnb

        return bnb.optim.PagedAdamW8bit(parameters, lr=spec.learning_rate, weight_decay=spec.weight_decay)
    return torch.optim.AdamW(parameters, lr=spec.learning_rate, weight_decay=spec.weight_decay)


def lr_factor(step: int, spec: GrpoSpec) -> float:
    """Multiplier of the base learning rate for optimizer step `step` (0-based)."""
    if spec.warmup_steps and step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    if spec.lr_schedule == "cosine":
        span = max(1, spec.steps - spec.warmup_steps)
        progress = min(1.0, (step - spec.warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def make_scheduler(optimizer: torch.optim.Optimizer, spec: GrpoSpec) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, spec))
