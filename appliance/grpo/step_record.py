"""One finished GRPO step as plain, typed data: what metrics.jsonl, the terminal, Prometheus, the daemon and the TUI read.

STDLIB ONLY: the daemon's API module and the TUI import this file, and they
must not pull torch, numpy or pydantic. `StepRecord.to_dict()` is exactly one
metrics.jsonl line; `StepRecord.from_dict()` reads it back and ignores keys it
does not know, so lines written by older or newer versions still load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

# The phases of a step whose seconds a record carries; "step" is the whole step.
PHASES = ("generate", "judge", "reward", "train", "sync", "checkpoint", "eval")
ROLES = ("student", "judge")
JUDGE_OUTCOMES = ("ok", "parse_error", "timeout")


def _known(cls, data: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


@dataclass(frozen=True)
class RewardStats:
    mean: float
    std: float

    @classmethod
    def from_dict(cls, data: dict) -> "RewardStats":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class MemoryReading:
    """Memory at the end of a step. Bytes; None where the device cannot tell."""

    peak_rss_bytes: int
    planned_peak_bytes: int | None = None
    device_used_bytes: int | None = None
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)
    components_used_bytes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryReading":
        values = _known(cls, data)
        values.setdefault("peak_rss_bytes", 0)
        return cls(**values)


@dataclass(frozen=True)
class EvalResult:
    """Evaluation on held-out problems (the first `problems` of the split), greedy or `samples` draws of each
    at `temperature`; the shares are over all draws."""

    accuracy: float
    format_compliance: float
    reward_mean: float
    problems: int
    temperature: float = 0.0
    samples: int = 1

    @classmethod
    def from_dict(cls, data: dict) -> "EvalResult":
        return cls(**_known(cls, data))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StepRecord:
    job: str
    step: int
    steps_total: int
    time: float  # wall clock (epoch seconds) when the step finished
    reward_mean: float
    reward_std: float
    rewards: dict[str, RewardStats]
    loss: float
    kl: float
    clip_ratio: float
    grad_norm: float
    learning_rate: float
    nonfinite: bool  # the loss or gradient was NaN/inf: the optimizer step was skipped
    groups_informative: int
    groups_total: int
    trained_sequences: int
    trained_tokens: int
    micro_batch_size: int
    completions: int
    completion_length_mean: float
    completion_length_max: int
    generated_tokens: dict[str, int]  # role ("student", "judge") -> tokens this step
    prompt_tokens: dict[str, int]
    tokens_per_second: dict[str, float]
    seconds: dict[str, float]  # phase -> seconds; "step" is the whole step
    memory: MemoryReading
    eval: EvalResult | None = None
    logprob_diff_mean: float = 0.0
    logprob_diff_max: float = 0.0
    judge_outcomes: dict[str, int] = field(default_factory=dict)  # cumulative; empty without a judge
    # Of groups_total (every group generated, all rounds), the ones the update used; None in older records.
    groups_trained: int | None = None
    sampling_rounds: int = 1  # generation rounds of the step (grpo.dynamic_sampling)
    prompts_skipped: int = 0  # settled prompts the data order passed over (grpo.skip_settled_after)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: one metrics.jsonl line."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepRecord":
        values = _known(cls, data)
        values["rewards"] = {
            name: stats if isinstance(stats, RewardStats) else RewardStats.from_dict(stats)
            for name, stats in (data.get("rewards") or {}).items()
        }
        memory = data.get("memory") or {}
        values["memory"] = memory if isinstance(memory, MemoryReading) else MemoryReading.from_dict(memory)
        evaluation = data.get("eval")
        values["eval"] = (
            evaluation if evaluation is None or isinstance(evaluation, EvalResult) else EvalResult.from_dict(evaluation)
        )
        for key in ("generated_tokens", "prompt_tokens", "tokens_per_second"):
            # Records written before roles existed held one number: the student's.
            if isinstance(values.get(key), (int, float)):
                values[key] = {"student": values[key]}
        values.setdefault("job", "")
        values.setdefault("steps_total", values.get("step", 0))
        values.setdefault("nonfinite", False)
        for key in ("generated_tokens", "prompt_tokens", "tokens_per_second", "seconds"):
            values.setdefault(key, {})
        return cls(**values)

    @property
    def student_tokens_per_second(self) -> float:
        return float(self.tokens_per_second.get("student", 0.0))


@dataclass(frozen=True)
class RunEvent:
    """Something that happened in a run besides a finished step.

    kinds: "phase" {"phase", "state": "start"|"end"}; "checkpoint" {"path", "best"};
    "eval" {"when": "before"|"step"|"after", **EvalResult}; "log" {"line"};
    "memory" {"planned_bytes": {component: bytes}, "budget_bytes", "device_total_bytes", "device_used_bytes"};
    "engine_metrics" {"snapshot": an engine's metrics_snapshot()}.
    """

    kind: str
    step: int
    data: dict
    time: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunEvent":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class RunResult:
    status: Literal["completed", "stopped"]
    step: int
    stop_reason: str | None = None
    best: dict | None = None
    eval_before: EvalResult | None = None
    eval_after: EvalResult | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
