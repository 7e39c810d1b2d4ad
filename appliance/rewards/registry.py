"""The reward registry: job-file reward specs -> weighted batch rewards -> scores per function.

A reward is either a registered rule (rules.py), a user plugin
("file.py:function", plugins.py) or "judge" (a batch reward supplied by the
judge module, which may score a whole group at once). All are called the same
way, on the step's list of RewardSample, so the step loop does not care which
is which.
"""

from __future__ import annotations

import inspect
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

from appliance.config.schema import RewardSpec
from appliance.conventions import JUDGE_REWARD, PLUGIN_SYNTAX, is_plugin_reward
from appliance.suggest import did_you_mean
from appliance.rewards.plugins import RewardError, load_plugin
from appliance.rewards.rules import RULES

JUDGE = JUDGE_REWARD


@dataclass(frozen=True)
class RewardSample:
    """One completion to score. `group` is the index of its prompt within the step."""

    prompt: str
    completion: str
    reference: str | None
    metadata: dict = field(default_factory=dict)
    group: int = 0


@runtime_checkable
class BatchReward(Protocol):
    """Scores a step's samples at once: one float per sample, in order."""

    name: str

    def __call__(self, samples: list[RewardSample]) -> list[float]: ...


@dataclass(frozen=True)
class RuleReward:
    """A per-sample function (rule or plugin) with its job-file params, as a BatchReward."""

    name: str
    function: Callable[..., float]
    params: dict = field(default_factory=dict)

    def __call__(self, samples: list[RewardSample]) -> list[float]:
        scores = []
        for position, sample in enumerate(samples):
            try:
                scores.append(
                    self.function(sample.prompt, sample.completion, sample.reference, sample.metadata, **self.params)
                )
            except Exception as error:  # a plugin's bug: one error naming the reward and sample, not a traceback
                raise RewardError(
                    f"reward {self.name!r} failed on sample {position}: {type(error).__name__}: {error}"
                ) from error
        return scores


@dataclass(frozen=True)
class WeightedReward:
    name: str
    weight: float
    fn: BatchReward


@dataclass(frozen=True)
class FunctionStats:
    mean: float
    std: float  # population std over the step's samples


@dataclass(frozen=True)
class RewardScores:
    """Scores of one step: each function's raw values and the weighted total, per sample."""

    per_function: dict[str, list[float]]
    total: list[float]

    def stats(self) -> dict[str, FunctionStats]:
        """Mean and std of each function's raw scores, plus "total", for metrics."""
        columns = dict(self.per_function, total=self.total)
        return {
            name: FunctionStats(statistics.fmean(values), statistics.pstdev(values))
            if values
            else FunctionStats(0.0, 0.0)
            for name, values in columns.items()
        }


def known_reward_names() -> list[str]:
    """Registered rule names plus "judge" (plugins are named by file and function instead)."""
    return sorted(RULES) + [JUDGE]


def build_rewards(
    specs: Sequence[RewardSpec], base_dir: Path, judge: BatchReward | None = None
) -> list[WeightedReward]:
    """Resolve each spec to a weighted batch reward; the first bad spec raises RewardError naming rewards[i]."""
    built: list[WeightedReward] = []
    for index, spec in enumerate(specs):
        where = f"rewards[{index}] ({spec.name!r})"
        if any(existing.name == spec.name for existing in built):
            raise RewardError(f"{where}: listed twice; give it one entry with the combined weight")
        if spec.name == JUDGE:
            if judge is None:
                raise RewardError(f"{where}: the judge reward needs a judge; add a 'judge' section to the job file")
            if spec.params:
                raise RewardError(f"{where}: the judge takes its settings from the 'judge' section, not params")
            built.append(WeightedReward(spec.name, spec.weight, judge))
            continue
        if is_plugin_reward(spec.name):
            function = load_plugin(spec.name, base_dir)
        elif spec.name in RULES:
            function = RULES[spec.name]
        else:
            raise RewardError(
                f"{where}: unknown reward{did_you_mean(spec.name, known_reward_names())} Known: "
                f"{', '.join(known_reward_names())}, or a plugin '{PLUGIN_SYNTAX}'"
            )
        _check_params(where, function, dict(spec.params))
        if spec.name in RULES:  # only our own rules are called at build time; a plugin's code runs in the step
            _try_rule(where, function, dict(spec.params))
        built.append(WeightedReward(spec.name, spec.weight, RuleReward(spec.name, function, dict(spec.params))))
    return built


def _check_params(where: str, function: Callable[..., float], params: dict) -> None:
    """Fail at build time, not mid-training, when params do not fit the function's signature."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # builtins without a signature: checked on first call
    try:
        signature.bind("prompt", "completion", "reference", {}, **params)  # the four arguments every reward takes
    except TypeError as error:
        accepted = [
            parameter.name
            for parameter in list(signature.parameters.values())[4:]
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        ]
        raise RewardError(
            f"{where}: params {sorted(params)} do not fit {getattr(function, '__name__', function)}{signature}: {error}"
            f" (accepted params: {', '.join(accepted) or 'none'})"
        ) from error


def _try_rule(where: str, function: Callable[..., float], params: dict) -> None:
    """Call a rule once on an empty completion so that bad param values (length target 0) fail now."""
    try:
        function("", "", None, {}, **params)
    except (RewardError, ValueError, TypeError) as error:  # a rule's own RewardError gets the entry's name too
        raise RewardError(f"{where}: {error}") from error


def score_samples(rewards: Sequence[WeightedReward], samples: list[RewardSample]) -> RewardScores:
    """Call every reward on the samples; total = sum of weight x score. Bad values raise RewardError."""
    per_function: dict[str, list[float]] = {}
    for reward in rewards:
        values = reward.fn(samples)
        if len(values) != len(samples):
            raise RewardError(f"reward {reward.name!r} returned {len(values)} scores for {len(samples)} samples")
        checked = []
        for position, value in enumerate(values):
            # A bool is an int to Python, and NaN or inf would poison the group's advantages: all refused.
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RewardError(
                    f"reward {reward.name!r} returned {value!r} for sample {position}; it must return a finite number"
                )
            checked.append(float(value))
        per_function[reward.name] = checked
    total = [
        # fsum: the weighted sum does not depend on the order the rewards are listed in.
        math.fsum(reward.weight * per_function[reward.name][position] for reward in rewards)
        for position in range(len(samples))
    ]
    return RewardScores(per_function=per_function, total=total)
