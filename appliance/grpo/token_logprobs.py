"""Log-probabilities of the sampled tokens without the full-vocabulary logits tensor.

The last hidden states go through the LM head a chunk of tokens at a time; each
chunk's logits are reduced to the sampled token's logprob at once and dropped.
Backward recomputes each chunk's logits (softmax - one-hot, times the head), so
autograd never holds more than one chunk of [tokens x vocab] either.
"""

from __future__ import annotations

import torch

from appliance.budget.components import logit_chunk_bytes, logit_chunk_tokens

# fp32 logits per chunk; None: the size for the hidden states' device, which the planner counts
# (budget/components.py logprob_bytes). Tests pin a small one.
CHUNK_LOGIT_BYTES: int | None = None


def _upcast(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit tensors (as the trainer's .float()), float64 kept."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    # The same operations, in the same dtypes, as model.lm_head(hidden).float() / temperature.
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return logits.to(_upcast(logits.dtype)) / temperature


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """hidden [T, H], weight [V, H], bias [V] or None, targets [T] -> logp [T] (fp32)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, rows: int):
        out = torch.empty(hidden.shape[0], dtype=_upcast(hidden.dtype), device=hidden.device)
        for start in range(0, hidden.shape[0], rows):
            logits = _chunk_logits(hidden[start : start + rows], weight, bias, temperature)
            chosen = logits.gather(1, targets[start : start + rows, None]).squeeze(1)
            out[start : start + rows] = chosen - torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        wide = _upcast(weight.dtype)
        grad_weight = torch.zeros_like(weight, dtype=wide) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=wide) if need_bias else None
        for start in range(0, hidden.shape[0], ctx.rows):
            chunk = hidden[start : start + ctx.rows]
            upstream = grad_out[start : start + ctx.rows].to(_upcast(grad_out.dtype))
            # d logp_t / d logits_t = onehot(target_t) - softmax(logits_t)
            grad_logits = torch.softmax(_chunk_logits(chunk, weight, bias, ctx.temperature), dim=-1)
            grad_logits.mul_(-upstream[:, None])
            grad_logits.scatter_add_(1, targets[start : start + ctx.rows, None], upstream[:, None])
            grad_logits = (grad_logits / ctx.temperature).to(hidden.dtype)
            if need_hidden:
                grad_hidden[start : start + ctx.rows] = grad_logits @ weight
            if need_weight:
                grad_weight += grad_logits.to(wide).T @ chunk.to(wide)
            if need_bias:
                grad_bias += grad_logits.to(wide).sum(0)
        grad_weight = grad_weight.to(weight.dtype) if need_weight else None
        grad_bias = grad_bias.to(bias.dtype) if need_bias else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """log softmax(head(hidden) / temperature)[targets] for hidden [N, C, H], targets [N, C]: [N, C] (fp32 or wider).

    chunk_bytes: fp32 logits per chunk (default: CHUNK_LOGIT_BYTES, else the size for hidden's device).
    """
    batch, width, size = hidden.shape
    flat = hidden.reshape(batch * width, size)
    rows = logit_chunk_tokens(
        head.out_features, chunk_bytes or CHUNK_LOGIT_BYTES or logit_chunk_bytes(hidden.device.type)
    )
    logp = _ChunkedTokenLogprobs.apply(flat, head.weight, head.bias, targets.reshape(-1), float(temperature), rows)
    return logp.view(batch, width)


def plain_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The same from materialised logits [N, C, V] (models whose head is not a plain linear layer)."""
    logits = logits.to(_upcast(logits.dtype)) / temperature
    chosen = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
