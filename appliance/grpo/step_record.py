"""One finished GRPO step as plain, typed data: what metrics.jsonl, the terminal, Prometheus, the daemon and the TUI
read; the hooks a run reports through; and the clock that times a step's phases.

STDLIB ONLY: the daemon's API module and the TUI import this file, and they
must not pull torch, numpy or pydantic. `StepRecord.to_dict()` is exactly one
metrics.jsonl line; `StepRecord.from_dict()` reads it back and ignores keys it
does not know, so lines written by older or newer versions still load.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal


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


# ----- where a run reports: the hooks a trainer is handed ---------------------------------------

StepCallback = Callable[[StepRecord], None]
EventCallback = Callable[[RunEvent], None]
StopCallback = Callable[[], "str | None"]


def _ignore(_: object) -> None:
    pass


@dataclass(frozen=True)
class RunHooks:
    on_step: StepCallback = _ignore
    on_event: EventCallback = _ignore


# ----- the phases of a step: timed, announced, their memory peaks recorded -----------------------

# Each timed phase of a step -> the budget plan's phase it runs in, or None where the plan has none.
# The plan names the scoring phase after the judge, the engine it adds there (and plans it only for
# a judge); the step, its events and StepRecord.seconds call it "reward".
PLANNED: dict[str, str | None] = {
    "generate": "generate",
    "reward": "judge",
    "train": "train",
    "sync": None,
    "checkpoint": None,
    "eval": None,
}
# The budget plan's phases (grpo/trainer.py's enter_phase wakes the engines each one needs).
PLANNED_PHASES = tuple(dict.fromkeys(planned for planned in PLANNED.values() if planned))


class PhaseClock:
    """`enter(planned)` puts the engines in the state the plan assumed for a planned phase (time sharing)."""

    def __init__(
        self,
        ledger=None,
        announce: Callable[..., None] | None = None,
        enter: Callable[[str], None] | None = None,
    ):
        self.ledger = ledger
        self.announce = announce or (lambda kind, **data: None)
        self.enter = enter or (lambda planned: None)
        self.seconds: dict[str, float] = {}
        self.started = time.monotonic()

    def _measures(self, planned: str | None) -> bool:
        # On CUDA the allocator reports peaks; on the CPU freed memory stays in the process,
        # so only the whole run's peak RSS is comparable with the plan.
        return (
            planned is not None
            and self.ledger is not None
            and self.ledger.plan.device.kind == "cuda"
            and planned in self.ledger.plan.phases
        )

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PLANNED:
            raise ValueError(f"phase {name!r} is not one of {tuple(PLANNED)}")
        planned = PLANNED[name]
        self.announce("phase", phase=name, state="start")
        if planned is not None:
            self.enter(planned)  # outside the timed part: waking and sleeping engines is not the phase's work
        measures = self._measures(planned)
        if measures:
            from appliance.budget.device_probe import reset_peak

            reset_peak(self.ledger.plan.device.kind)
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - began
            if measures:
                from appliance.budget.device_probe import peak_bytes

                self.ledger.phase_peak(planned, peak_bytes(self.ledger.plan.device.kind))
            self.announce("phase", phase=name, state="end")

    def total(self) -> dict[str, float]:
        """The phase seconds plus "step", the whole step so far."""
        return {**self.seconds, "step": time.monotonic() - self.started}
