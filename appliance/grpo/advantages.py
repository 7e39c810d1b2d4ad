"""Group-relative advantages: each completion is scored against its own group.

A = (r - mean(group)) / (std(group) + eps), or r - mean(group) when the job
turns reward scaling off (Dr. GRPO). std is the sample standard deviation
(n - 1), as in TRL. A group whose rewards are all equal carries no signal
(every advantage is zero); it is marked so the trainer skips its compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPSILON = 1e-4


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor  # [groups, group_size]
    group_mean: torch.Tensor  # [groups]
    group_std: torch.Tensor  # [groups]
    informative: torch.Tensor  # [groups] bool: False when every reward in the group is equal


def group_advantages(
    rewards: torch.Tensor, scale_by_std: bool = True, equal_tolerance: float = 1e-6
) -> GroupAdvantages:
    """rewards: [groups, group_size] -> advantages of the same shape."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, group_size>=2], got {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64)
    mean = rewards.mean(dim=1)
    std = rewards.std(dim=1, unbiased=True)
    centred = rewards - mean.unsqueeze(1)
    advantages = centred / (std.unsqueeze(1) + EPSILON) if scale_by_std else centred
    informative = (rewards.max(dim=1).values - rewards.min(dim=1).values) > equal_tolerance
    advantages = torch.where(informative.unsqueeze(1), advantages, torch.zeros_like(advantages))
    return GroupAdvantages(advantages.float(), mean.float(), std.float(), informative)
