"""The transformers engine reads each sampled token's logprob one generation step at a time."""

from __future__ import annotations

import torch

from appliance.engines.hf import sampled_logprobs


def test_per_step_logprobs_equal_the_log_softmax_of_all_steps_at_once():
    generator = torch.Generator().manual_seed(0)
    scores = tuple(torch.randn(3, 50, generator=generator) * 4 for _ in range(5))
    generated = torch.randint(0, 50, (3, 5), generator=generator)
    at_once = torch.log_softmax(torch.stack(scores, dim=1), dim=-1).gather(2, generated.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(sampled_logprobs(scores, generated), at_once, atol=1e-6)


def test_a_top_p_masked_score_gives_the_renormalised_probability():
    # top-p leaves -inf outside the nucleus: the sampled token's logprob is over the kept tokens only.
    step = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]])
    logprob = sampled_logprobs((step,), torch.tensor([[1]]))
    assert torch.allclose(logprob, torch.tensor([[torch.log(torch.tensor(0.5))]]))


def test_no_steps_give_an_empty_row_per_sequence():
    assert sampled_logprobs((), torch.zeros((2, 0), dtype=torch.long)).shape == (2, 0)
