"""A SwiGLU MLP that keeps two of its three intermediates for backward.

`down(silu(gate(x)) * up(x))` run by plain autograd saves gate(x) for silu's
backward and both factors of the product for the mul's: three [tokens x
intermediate] tensors a layer, the largest part of what a decoder layer keeps.
`silu(gate)` is cheap to rebuild from `gate`, so `_SiluGate` saves only `gate`
and `up` and recomputes it in backward: a third less of the MLP's saved bytes
(18% of a SmolLM2 layer's in fp32, 14% of a Llama-3.1-8B layer's in bf16) for
one elementwise op. The forward runs the same operations in the same dtypes and
backward the kernels plain autograd would, on the same tensors, so values and
gradients are bit for bit the plain model's (tests/grpo/test_swiglu.py). The
planner counts two intermediates (budget/components.py).
"""

from __future__ import annotations

import types

import torch
from torch.nn import functional as F


class _SiluGate(torch.autograd.Function):
    """silu(gate) * up, saving gate and up only."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # The kernels plain autograd runs (mul's backward, then aten's silu_backward) on the same tensors.
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[1]:
            grad_up = grad * F.silu(gate)
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


def silu_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up; under autograd through `_SiluGate`."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluGate.apply(gate, up)
    return F.silu(gate) * up


def _lean_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_gate(self.gate_proj(x), self.up_proj(x)))


def is_silu_gated_mlp(module: torch.nn.Module) -> bool:
    """A transformers SwiGLU MLP (Llama, Qwen2, Mistral, SmolLM): gate, up and down projections and a SiLU."""
    act = getattr(module, "act_fn", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
    return silu and all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj"))


def keep_gate_and_up_only(model: torch.nn.Module) -> int:
    """Run every SwiGLU MLP of `model` through `_SiluGate`; returns how many were changed."""
    changed = 0
    for module in model.modules():
        if is_silu_gated_mlp(module):
            module.forward = types.MethodType(_lean_forward, module)
            changed += 1
    return changed
