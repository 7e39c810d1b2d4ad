"""Group-relative advantages against numbers worked out by hand."""

import math

import pytest
import torch

from appliance.grpo.rollout import EPSILON, group_advantages


def test_advantages_are_centred_and_scaled_by_sample_std():
    result = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]]))
    # group 0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735
    expected0 = 0.5 / (math.sqrt(1 / 3) + EPSILON)
    assert result.advantages[0].tolist() == pytest.approx([expected0, -expected0, -expected0, expected0], rel=1e-6)
    # group 1: mean 2, sample std sqrt(2 / 3)
    expected1 = 1.0 / (math.sqrt(2 / 3) + EPSILON)
    assert result.advantages[1].tolist() == pytest.approx([expected1, -expected1, 0.0, 0.0], rel=1e-6)
    assert result.group_mean.tolist() == pytest.approx([0.5, 2.0])
    assert result.informative.tolist() == [True, True]


def test_all_equal_group_has_zero_advantage_and_is_marked_uninformative():
    result = group_advantages(torch.tensor([[2.0, 2.0, 2.0], [0.0, 1.0, 0.0]]))
    assert result.advantages[0].tolist() == [0.0, 0.0, 0.0]
    assert result.informative.tolist() == [False, True]


def test_unscaled_advantages_are_only_centred():
    result = group_advantages(torch.tensor([[4.0, 0.0, 2.0]]), scale_by_std=False)
    assert result.advantages[0].tolist() == pytest.approx([2.0, -2.0, 0.0])


def test_rejects_groups_of_one():
    with pytest.raises(ValueError, match="group_size>=2"):
        group_advantages(torch.tensor([[1.0], [2.0]]))
