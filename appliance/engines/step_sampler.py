"""How the transformers engine picks each generated token and reads its logprob.

generate() runs with do_sample=False and a processor chain of transformers'
own temperature and top-p warpers, then `StepSampler`: it picks each row's
token (a draw from softmax(scores), or the argmax when greedy), records that
token's logprob under the scores, and returns scores whose argmax is the
token, which generate() then appends.

- Drawing by inverse CDF, not torch.multinomial: multinomial races an
  exponential variate per vocabulary entry, a large share of a CPU generate;
  one uniform per row against cumulative sums costs a small fraction of it
  (bench/README.md, "grpo_step.py", "inverse-CDF sampling"). The sums run in
  float64 (float32's spacing at 1.0 would swallow a 49k vocabulary's small
  probabilities) in two levels: the masses of blocks of BLOCK_TOKENS, then the
  chosen block's own tokens, so that no 8-byte copy of [rows, vocab] is made
  (past the trainer's mmap threshold it would page-fault in fresh every step).
- Only the chosen tokens' logprobs are kept, one number a row a step, where
  generate's output_scores kept every step's [rows, vocab] fp32 scores until
  the end.
- Two [rows, vocab] fp32 buffers, the probabilities and the returned scores,
  are reused from step to step (budget/components.generation_working_bytes).

It never changes which distribution a token is drawn from: the warpers are
transformers' own, and greedy returns the scores untouched.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

# Tokens per block of the two-level draw: a block first, then a token inside it. For vocabularies of tens of
# thousands both levels' cumulative sums stay a few hundred entries long.
BLOCK_TOKENS = 256


def block_masses(weights: torch.Tensor) -> torch.Tensor:
    """float64 sums of `weights` [rows, blocks x BLOCK_TOKENS] per block: [rows, blocks]."""
    return weights.view(weights.shape[0], -1, BLOCK_TOKENS).sum(dim=-1).double()


def draw(weights: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
    """One token per row, with probability proportional to `weights` [rows, blocks x BLOCK_TOKENS] (not
    negative, not all 0 in a row), given their `block_masses`: [rows]. A weight of 0 is never drawn."""
    rows = weights.shape[0]
    blocks = weights.view(rows, -1, BLOCK_TOKENS)  # a view: the weights are never copied whole
    cumulative = masses.cumsum(dim=-1)
    # u in (0, total]: the first block (and token) whose cumulative sum reaches it has a mass above 0.
    uniform = (1.0 - torch.rand(rows, 1, dtype=torch.float64, device=weights.device)) * cumulative[:, -1:]
    block = torch.searchsorted(cumulative, uniform).clamp_(max=blocks.shape[1] - 1)
    mass = masses.gather(1, block)
    inside = blocks[torch.arange(rows, device=weights.device), block.squeeze(1)].double().cumsum(dim=-1)
    # u's position inside the chosen block, rescaled to the block's own float64 sum (which may differ from
    # its mass in the last bits); kept above 0 so that a leading zero-weight token is never the answer.
    residual = (uniform - (cumulative.gather(1, block) - mass)) * inside[:, -1:] / mass
    offset = torch.searchsorted(inside, residual.clamp_(min=torch.finfo(torch.float64).tiny))
    return (block * BLOCK_TOKENS + offset.clamp_(max=BLOCK_TOKENS - 1)).squeeze(1)


class StepSampler(LogitsProcessor):
    """The last processor of a do_sample=False generate (see the module docstring). `logprobs()` gives the
    chosen tokens' log-probabilities under the scores they were chosen from, [rows, steps]."""

    def __init__(self, greedy: bool) -> None:
        self.greedy = greedy
        self._steps: list[torch.Tensor] = []
        self._weights: torch.Tensor | None = None
        self._chosen: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, vocab = scores.shape
        # Buffers are made for the first step of a batch and reused by every later step of it.
        if self._weights is None or self._weights.shape[0] != rows:
            # Padded to whole blocks with zeros, which are never drawn.
            padded = -(-vocab // BLOCK_TOKENS) * BLOCK_TOKENS
            self._weights = torch.zeros(rows, padded, dtype=torch.float32, device=scores.device)
            self._chosen = None if self.greedy else torch.empty_like(scores)
        top, best = scores.max(dim=-1, keepdim=True)
        weights = self._weights
        torch.sub(scores, top, out=weights[:, :vocab]).exp_()  # in (0, 1], 0 where a warper set -inf
        masses = block_masses(weights)
        tokens = best.squeeze(1) if self.greedy else draw(weights, masses)
        chosen = scores.gather(1, tokens[:, None]).squeeze(1) - top.squeeze(1)
        # log p = (score - max) - log(sum of exp(score - max)), the sum taken in float64 from the block masses.
        self._steps.append((chosen.double() - masses.sum(dim=-1).log()).float())
        if self.greedy:
            return scores
        # generate() runs greedy over what we return: a row that is -inf except at the drawn token makes the
        # draw its argmax.
        return self._chosen.fill_(float("-inf")).scatter_(1, tokens[:, None], 0.0)

    def logprobs(self, rows: int) -> torch.Tensor:
        if not self._steps:
            return torch.zeros((rows, 0), dtype=torch.float32)
        return torch.stack(self._steps, dim=1)


def token_processors(temperature: float, top_p: float) -> tuple[LogitsProcessorList, StepSampler]:
    """The warpers transformers' sampling applies, in its order, then the sampler; greedy at temperature 0."""
    greedy = temperature <= 0
    sampler = StepSampler(greedy)
    processors = LogitsProcessorList()
    # Temperature before top-p, as transformers orders them when it samples; each is left out when it would do
    # nothing, as transformers does too.
    if not greedy and temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if not greedy and top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    processors.append(sampler)
    return processors, sampler
