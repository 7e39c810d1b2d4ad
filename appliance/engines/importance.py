"""Truncated importance sampling between the rollout engine and the trainer.

When rollouts come from vLLM, the tokens were sampled from vLLM's
distribution, computed with other kernels (and on CUDA another dtype) than the
trainer's forward pass. The GRPO ratio uses the trainer's own recomputed
logprobs; this module gives the per-token correction weight
min(exp(trainer - engine), cap) that the trainer multiplies into its per-token
loss (truncated importance sampling, as in "Your efficient RL framework
secretly brings you off-policy RL training"), plus the logprob-gap statistics
logged per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ImportanceStats:
    """How far the engine's logprobs are from the trainer's, over the masked tokens."""

    mean_abs_logprob_diff: float
    max_abs_logprob_diff: float
    # Share of tokens whose weight hit the cap.
    truncated_fraction: float
    tokens: int


def truncated_importance_weights(
    trainer_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, ImportanceStats]:
    """Per-token weights min(exp(trainer - engine), cap), zero where mask is 0, detached.

    All three tensors have the same shape (batch, completion_tokens); `mask` is
    1 for real completion tokens and 0 for padding.
    """
    if not (trainer_logprobs.shape == engine_logprobs.shape == mask.shape):
        raise ValueError(
            "trainer_logprobs, engine_logprobs and mask must have the same shape, got "
            f"{tuple(trainer_logprobs.shape)}, {tuple(engine_logprobs.shape)}, {tuple(mask.shape)}"
        )
    # A weight above 1 is where the engine under-sampled a token; the cap only limits how far it counts up.
    if cap < 1.0:
        raise ValueError(
            f"the importance sampling cap must be >= 1.0 (a cap below 1 down-weights every token), got {cap}"
        )
    # Weights scale the loss; they are not trained through (gradients flow through the ratio, not through these).
    with torch.no_grad():
        keep = mask.to(torch.bool)
        # In fp32 whatever the inputs' dtype: two close logprobs differ by less than bf16 resolves at their size.
        log_ratio = trainer_logprobs.detach().float() - engine_logprobs.detach().float()
        # Padding may hold any value (even -inf); zero it before exp.
        log_ratio = torch.where(keep, log_ratio, torch.zeros_like(log_ratio))
        weights = torch.clamp(torch.exp(log_ratio), max=cap) * keep
        token_count = int(keep.sum().item())
        if token_count == 0:
            return weights, ImportanceStats(0.0, 0.0, 0.0, 0)
        gaps = log_ratio.abs()[keep]
        truncated = (torch.exp(log_ratio)[keep] > cap).float().mean()
        stats = ImportanceStats(
            mean_abs_logprob_diff=float(gaps.mean()),
            max_abs_logprob_diff=float(gaps.max()),
            truncated_fraction=float(truncated),
            tokens=token_count,
        )
    return weights, stats
