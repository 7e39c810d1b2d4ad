"""The GRPO policy loss and its four aggregation variants (grpo, bnpo, dr_grpo, dapo)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass
class LossOutput:
    loss: torch.Tensor
    clip_ratio: float  # fraction of completion tokens whose ratio was clipped (in the direction that matters)
    kl_mean: float
    ratio_mean: float


@dataclass(frozen=True)
class StepNormalizer:
    """Step-wide counts, so micro-batch losses add up to the whole-step loss."""

    sequences: int
    tokens: int
    micro_batches: int
    max_new_tokens: int


def per_token_loss(
    logp, old_logp, advantages, mask, epsilon, epsilon_high, beta=0.0, ref_logp=None, importance_weights=None
):
    """l_it and the diagnostics. Shapes: logp/old_logp/mask/ref/weights [N, T], advantages [N].

    Per token t of completion i (mask m_it = 1 on real completion tokens):

        ratio_it = exp(logp_it - old_logp_it)
        surrogate_it = min(ratio_it * A_i, clip(ratio_it, 1 - epsilon, 1 + epsilon_high) * A_i)
        kl_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1          (k3 estimator, beta > 0 only)
        l_it = -(surrogate_it * w_it) + beta * kl_it

    w_it is an optional truncated importance weight (rollouts sampled by another engine, e.g. vLLM); 1 otherwise.
    """
    high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(logp - old_logp)
    advantage = advantages.unsqueeze(1)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + high) * advantage
    surrogate = torch.minimum(unclipped, clipped)
    if importance_weights is not None:
        surrogate = surrogate * importance_weights
    loss = -surrogate
    kl = torch.zeros_like(logp)
    if beta > 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs reference logprobs")
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        loss = loss + beta * kl
    is_clipped = ((ratio < 1.0 - epsilon) & (advantage < 0)) | ((ratio > 1.0 + high) & (advantage > 0))
    return loss, kl, ratio, is_clipped


def aggregate(loss: torch.Tensor, mask: torch.Tensor, loss_type: str, normalizer: StepNormalizer) -> torch.Tensor:
    """Reduce l_it [N, T] of one micro-batch to its share of the step loss.

    The variants differ only in how l_it is averaged over a batch of N completions:

        grpo     (1/N) sum_i (1/|o_i|) sum_t l_it   mean over sequences of their token mean (DeepSeekMath);
                                                    favours long wrong answers (each token penalised less)
        bnpo     sum_it l_it / sum_it m_it          each micro-batch normalised by its own tokens
        dr_grpo  sum_it l_it / (N * L_max)          a constant divisor: Dr. GRPO, no length bias
        dapo     sum_it l_it / T_step               the tokens of the whole step: DAPO's token-level loss

    With gradient accumulation `normalizer` carries the step-wide quantity (N of the step for grpo/dr_grpo,
    T_step for dapo, the number of micro-batches for bnpo), so the accumulated gradient equals one big batch's.
    """
    mask = mask.to(loss.dtype)
    masked = loss * mask
    if loss_type == "grpo":
        per_sequence = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_sequence.sum() / normalizer.sequences
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0) / normalizer.micro_batches
    if loss_type == "dr_grpo":
        return masked.sum() / (normalizer.sequences * normalizer.max_new_tokens)
    if loss_type == "dapo":
        return masked.sum() / max(normalizer.tokens, 1)
    raise ValueError(f"unknown loss type '{loss_type}'; choose one of {', '.join(LOSS_TYPES)}")


def policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    loss_type,
    normalizer,
    epsilon,
    epsilon_high=None,
    beta=0.0,
    ref_logp=None,
    importance_weights=None,
) -> LossOutput:
    loss, kl, ratio, is_clipped = per_token_loss(
        logp, old_logp, advantages, mask, epsilon, epsilon_high, beta, ref_logp, importance_weights
    )
    total = aggregate(loss, mask, loss_type, normalizer)
    real = mask.bool()
    count = max(int(real.sum()), 1)
    return LossOutput(
        loss=total,
        clip_ratio=float(is_clipped[real].sum()) / count,
        kl_mean=float(kl.detach()[real].sum()) / count,
        ratio_mean=float(ratio.detach()[real].sum()) / count,
    )
