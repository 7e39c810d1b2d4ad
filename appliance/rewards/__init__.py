"""Rewards: rule functions, user plugins and the judge behind one batch interface (see registry.py)."""

from appliance.rewards.extract import answers_match, extract_answer
from appliance.rewards.plugins import RewardError
from appliance.rewards.registry import (
    BatchReward,
    FunctionStats,
    RewardSample,
    RewardScores,
    RuleReward,
    WeightedReward,
    build_rewards,
    known_reward_names,
    score_samples,
)
from appliance.rewards.rules import RULES, format_compliant

__all__ = [
    "BatchReward",
    "FunctionStats",
    "RULES",
    "RewardError",
    "RewardSample",
    "RewardScores",
    "RuleReward",
    "WeightedReward",
    "answers_match",
    "build_rewards",
    "extract_answer",
    "format_compliant",
    "known_reward_names",
    "score_samples",
]
