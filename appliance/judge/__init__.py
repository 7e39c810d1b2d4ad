"""The local judge LLM as a reward: pointwise or group (RULER-style) scoring, validated, logged, cached."""

from appliance.judge.judge import Judge, neutral_fill

__all__ = ["Judge", "neutral_fill"]
