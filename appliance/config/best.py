"""What `checkpoint.best_metric` may name, its direction, and its value in a metrics.jsonl record.

One place for the rule: config checks validate a job file's best_metric with
it, and the trainer reads the value of each step's record through it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from appliance.config.schema import JobSpec

# Numbers of a StepRecord that make sense to keep the best of.
STEP_METRICS = ("reward_mean", "reward_std", "loss", "kl", "clip_ratio", "completion_length_mean", "groups_informative")
EVAL_METRICS = ("eval.accuracy", "eval.format_compliance", "eval.reward_mean")
# checkpoint.eval_every: auto evaluates this often, on at most this many held-out problems (unless eval_limit
# says): a small evaluation that best/ can follow, costing the CPU demo about a percent of its training time
# (bench/README.md, "Figures behind constants in the code", "The automatic evaluation").
AUTO_EVAL_EVERY = 10
AUTO_EVAL_LIMIT = 32
# Metrics where lower is better; every other one is maximised.
MINIMIZED = ("loss", "kl", "reward_std", "completion_length_mean", "clip_ratio")


def allowed_metrics(reward_names: Iterable[str]) -> list[str]:
    """Every valid best_metric for a job with these rewards."""
    per_reward = [f"rewards.{name}.mean" for name in [*reward_names, "total"]]
    return [*STEP_METRICS, *per_reward, *EVAL_METRICS]


def follows_held_out(best_metric: str | None) -> bool:
    """best/ follows a held-out number: the default (unset) or an eval.* metric."""
    return best_metric is None or best_metric in EVAL_METRICS


def evaluation_every(spec: "JobSpec") -> int | None:
    """Steps between held-out evaluations during training, None for none: checkpoint.eval_every with auto
    resolved (on for a dataset task with held-out problems whose best/ follows held-out accuracy)."""
    every = spec.checkpoint.eval_every
    if every != "auto":
        return every
    dataset_held_out = spec.task.environment is None and spec.task.held_out > 0
    return AUTO_EVAL_EVERY if dataset_held_out and follows_held_out(spec.checkpoint.best_metric) else None


def evaluation_limit(spec: "JobSpec") -> int | None:
    """Held-out problems per evaluation during training: checkpoint.eval_limit, else a small share under auto."""
    if spec.checkpoint.eval_limit is not None or spec.checkpoint.eval_every != "auto":
        return spec.checkpoint.eval_limit
    return AUTO_EVAL_LIMIT


def resolve(best_metric: str | None, best_mode: str | None, evaluates: bool) -> tuple[str, str]:
    """(metric, "max" | "min") for a checkpoint section, defaults filled in."""
    metric = best_metric or ("eval.accuracy" if evaluates else "reward_mean")
    return metric, best_mode or ("min" if metric in MINIMIZED else "max")


def metric_value(record: dict[str, Any], metric: str) -> float | None:
    """The finite number at a dotted path of a record's dict, or None (e.g. a step without evaluation)."""
    value: Any = record
    for part in metric.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def improves(value: float, best: float | None, mode: str) -> bool:
    return best is None or (value > best if mode == "max" else value < best)
