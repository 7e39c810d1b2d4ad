"""Truncated importance weights between vLLM's sampling logprobs and the trainer's."""

from __future__ import annotations

import math

import pytest
import torch

from appliance.engines.importance import truncated_importance_weights


def test_weights_are_capped_ratios_zero_on_padding_and_carry_no_gradient():
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, 0.0]], requires_grad=True)
    engine = torch.tensor([[-1.1, -1.0, -2.0], [-3.0, -1.2, float("-inf")]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])

    weights, stats = truncated_importance_weights(trainer, engine, mask, cap=2.0)

    expected = torch.tensor([[math.exp(0.1), math.exp(-1.0), 2.0], [1.0, math.exp(0.2), 0.0]])
    assert torch.allclose(weights, expected, atol=1e-6)
    assert not weights.requires_grad
    assert stats.tokens == 5
    assert stats.mean_abs_logprob_diff == pytest.approx((0.1 + 1.0 + 1.5 + 0.0 + 0.2) / 5, abs=1e-6)
    assert stats.max_abs_logprob_diff == pytest.approx(1.5)
    assert stats.truncated_fraction == pytest.approx(1 / 5)


def test_bad_shapes_and_caps_below_one_are_refused():
    ones = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="same shape"):
        truncated_importance_weights(ones, torch.zeros(2, 4), torch.ones(2, 3), cap=2.0)
    with pytest.raises(ValueError, match="cap must be >= 1.0"):
        truncated_importance_weights(ones, ones, torch.ones(2, 3), cap=0.5)


def test_all_padding_gives_zero_weights_and_empty_stats():
    weights, stats = truncated_importance_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), cap=2.0)
    assert weights.sum() == 0
    assert stats.tokens == 0
