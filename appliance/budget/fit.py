"""Auto-fit: the batch sizes, checkpointing, rollout weights and time-sharing that fit a budget.

The open choices are searched with cheap arithmetic (see `candidates`) and the
best plan that fits is kept. "Best" ranks what costs the most
time first: a bigger rollout batch (generation dominates a GRPO step), then a
bigger judge batch, then training throughput (micro-batch tokens up to where
the device is saturated: about 16k on a GPU, 512 on the CPU; checkpointing
costs about a third more compute), then keeping every engine awake (sleep and
wake cost seconds per step, less than a starved trainer), and last a merged
rollout copy of the
weights (faster generation, worth the memory once nothing more important
needs it). On the CPU, where generating through 4-bit weights is slowest, the copy ranks above
training throughput while the micro-batch keeps half the saturating tokens. Values the
job file sets are taken as given. Each choice records why it was made.

It never overrides what the job file set and never returns a plan above the budget as fitting.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from appliance.budget.phase_memory import FitChoices, PhasePlan, Sizing, phase_plans
from appliance.budget.reasons import FitReason
from appliance.budget.workload import Workload

CHECKPOINTING_COMPUTE_COST = 0.75  # throughput kept with gradient checkpointing (one extra forward)
# Micro-batch tokens past which a forward + backward runs no faster per token, by device kind. On the CPU the
# speed per token flattens by about 512 tokens (bench/README.md, "grpo_step.py", "stops at saturation"), so a
# micro-batch of 512+ tokens without checkpointing ranks above any with it.
SATURATING_MICRO_BATCH_TOKENS = {"cpu": 512, "cuda": 16384}
REASON_KEYS = (
    "micro_batch_size",
    "grad_accumulation",
    "gradient_checkpointing",
    "rollout_weights",
    "time_share",
    "rollout_batch",
    "judge_batch",
)


def halvings(n: int) -> list[int]:
    """n, n/2, ... 1 (rounded up), largest first."""
    values, value = [], n
    while True:
        values.append(value)
        if value == 1:
            return values
        value = (value + 1) // 2


def peak_of(phases: dict[str, PhasePlan]) -> int:
    return max(p.peak_bytes for p in phases.values())


def _rank(s: Sizing, work: Workload) -> tuple:
    # Past saturation a micro-batch no longer speeds training up; a merged copy still speeds generation.
    saturating = SATURATING_MICRO_BATCH_TOKENS.get(work.device_kind, SATURATING_MICRO_BATCH_TOKENS["cuda"])
    tokens = min(s.micro_batch_size * work.sequence_tokens, saturating)
    train = tokens * (CHECKPOINTING_COMPUTE_COST if s.gradient_checkpointing else 1.0)
    copy = s.rollout_weights == "merged_copy"
    # On the CPU a merged copy outweighs a micro-batch of at least half the saturating tokens: generating from
    # the 4-bit weights costs a lean step more than the smaller micro-batch does (bench/README.md, "Figures
    # behind constants in the code", "A merged copy before a larger micro-batch").
    copy_first = copy and work.device_kind == "cpu" and 2 * tokens >= saturating
    return (s.rollout_batch, s.judge_batch, copy_first, train, not s.time_share, copy)


def _largest(values: list[int], fits) -> int | None:
    """The first (largest) value for which fits(value) holds; memory only grows with each size."""
    for value in values:
        if fits(value):
            return value
    return None


class Peaks:
    """The peak of each Sizing of one workload, planned once: the search and the reasons ask for the same ones."""

    def __init__(self, work: Workload):
        self.work = work
        self.plans: dict[Sizing, dict[str, PhasePlan]] = {}

    def phases(self, s: Sizing) -> dict[str, PhasePlan]:
        if s not in self.plans:
            self.plans[s] = phase_plans(self.work, s)
        return self.plans[s]

    def __call__(self, s: Sizing, **change) -> int:
        """The peak of `s`, with the fields in `change` changed."""
        return peak_of(self.phases(replace(s, **change)))


def candidates(
    work: Workload,
    budget_bytes: int,
    micro_batch: int | None,
    checkpointing: bool | None,
    rollout_weights: str,
    peaks: Peaks | None = None,
):
    """For each setting of the yes/no choices, the largest batch sizes that fit, in order of importance.

    Peaks grow with every batch size, so maximizing the rollout batch (with the
    other batches at their smallest), then the judge batch, then the micro-batch
    finds the same best plan as trying every combination.
    """
    micro_batches = [micro_batch] if micro_batch else halvings(work.sequences)
    checkpointings = [checkpointing] if checkpointing is not None else [False, True]
    weights = [rollout_weights] if rollout_weights != "auto" else ["merged_copy", "shared"]
    if rollout_weights == "auto" and work.student_shards > 1:  # a whole copy on every rank defeats the sharding
        weights = ["shared"]
    if work.rollout_engine == "vllm":  # vLLM holds its own copy whatever the setting: one candidate
        weights = weights[:1]
    judge_batches = halvings(work.judge_calls) if work.judge is not None else [0]
    peaks = peaks or Peaks(work)
    # Every yes/no setting is tried; only the batch sizes are searched, largest first, within each.
    for ts, w, gc in itertools.product((False, True), weights, checkpointings):

        def fits(rb: int, jb: int, mb: int) -> bool:
            return peaks(Sizing(mb, gc, w, ts, rb, jb)) <= budget_bytes

        smallest_mb, smallest_jb = micro_batches[-1], judge_batches[-1]
        rb = _largest(halvings(work.sequences), lambda value: fits(value, smallest_jb, smallest_mb))
        if rb is None:  # not even one sequence at a time fits: kept, so a plan that fits nothing can be shown
            yield Sizing(smallest_mb, gc, w, ts, 1, smallest_jb)
            continue
        jb = _largest(judge_batches, lambda value: fits(rb, value, smallest_mb))
        mb = _largest(micro_batches, lambda value: fits(rb, jb, value))
        yield Sizing(mb, gc, w, ts, rb, jb)


def auto_fit(
    work: Workload,
    budget_bytes: int,
    micro_batch: int | None = None,
    checkpointing: bool | None = None,
    rollout_weights: str = "auto",
) -> tuple[FitChoices, dict[str, PhasePlan]]:
    """The best Sizing that fits, or the smallest one when none does; with phases and reasons."""
    peaks = Peaks(work)
    found = candidates(work, budget_bytes, micro_batch, checkpointing, rollout_weights, peaks)
    planned = [(s, peaks.phases(s)) for s in found]
    fitting = [(s, p) for s, p in planned if peak_of(p) <= budget_bytes]
    if fitting:
        sizing, phases = max(fitting, key=lambda item: _rank(item[0], work))
    else:
        # Nothing fits: show the configuration that needs least, in its worst phase and then overall.
        sizing, phases = min(planned, key=lambda item: (peak_of(item[1]), sum(p.peak_bytes for p in item[1].values())))
    asked = _Asked(micro_batch, checkpointing, rollout_weights)
    reasons = _reasons(work, sizing, phases, budget_bytes, asked, peaks) if fitting else _nothing_fits(budget_bytes)
    choices = FitChoices(
        micro_batch_size=sizing.micro_batch_size,
        grad_accumulation=math.ceil(work.sequences / sizing.micro_batch_size),
        gradient_checkpointing=sizing.gradient_checkpointing,
        rollout_weights=sizing.rollout_weights,
        time_share=sizing.time_share,
        rollout_batch=sizing.rollout_batch,
        rollout_kv_bytes=phases["generate"].resident["rollout_kv"],
        judge_batch=sizing.judge_batch,
        judge_kv_bytes=phases["judge"].resident["judge_kv"] if "judge" in phases else 0,
        reasons=reasons,
    )
    return choices, phases


@dataclass(frozen=True)
class _Asked:
    """What the job file set (None / "auto": the fit chooses)."""

    micro_batch: int | None
    checkpointing: bool | None
    rollout_weights: str


def _nothing_fits(budget: int) -> dict[str, FitReason]:
    return dict.fromkeys(REASON_KEYS, FitReason("nothing_fits", budget))


def _reasons(
    work: Workload, s: Sizing, phases: dict[str, PhasePlan], budget: int, asked: _Asked, peaks: Peaks
) -> dict[str, FitReason]:
    """Why each choice of a plan that fits took its value; the alternatives' peaks come from `peaks`."""

    def next_size_up(field: str, value: int, limit: int) -> FitReason:
        """Why not the next larger candidate: it would not fit (or there is none)."""
        if value >= limit:
            return FitReason("all_fit", budget, size=limit)
        larger = min(v for v in halvings(limit) if v > value)
        return FitReason("larger_needs", budget, larger=larger, needs_bytes=peaks(s, **{field: larger}))

    reasons = {
        "micro_batch_size": FitReason("set_in_job", note="grpo.micro_batch_size")
        if asked.micro_batch
        else next_size_up("micro_batch_size", s.micro_batch_size, work.sequences),
        "grad_accumulation": FitReason("rounded_up", budget, size=work.sequences, larger=s.micro_batch_size),
        "gradient_checkpointing": _checkpointing_reason(s, budget, asked, peaks),
        "rollout_weights": _weights_reason(work, s, phases, budget, asked, peaks),
        "time_share": FitReason("awake_too_big", budget, needs_bytes=peaks(s, time_share=False))
        if s.time_share
        else FitReason("all_awake", budget),
        "rollout_batch": next_size_up("rollout_batch", s.rollout_batch, work.sequences),
    }
    if work.judge is not None:
        reasons["judge_batch"] = next_size_up("judge_batch", s.judge_batch, work.judge_calls)
    return reasons


def _checkpointing_reason(s: Sizing, budget: int, asked: _Asked, peaks: Peaks) -> FitReason:
    if asked.checkpointing is not None:
        return FitReason("set_in_job", note="student.gradient_checkpointing")
    if not s.gradient_checkpointing:
        return FitReason("activations_fit", budget)
    without = peaks(s, gradient_checkpointing=False)
    kind = "checkpointing_needed" if without > budget else "checkpointing_faster"
    return FitReason(kind, budget, size=s.micro_batch_size, needs_bytes=without)


def _weights_reason(
    work: Workload, s: Sizing, phases: dict[str, PhasePlan], budget: int, asked: _Asked, peaks: Peaks
) -> FitReason:
    copy = phases["generate"].resident["rollout_weights"]
    if work.rollout_engine == "vllm":
        return FitReason("vllm_copy", budget, needs_bytes=copy)
    if asked.rollout_weights != "auto":
        return FitReason("set_in_job", note="engine.rollout_weights")
    if s.rollout_weights == "merged_copy":
        return FitReason("merged_copy_fits", budget, needs_bytes=copy, note=work.copy_dtype)
    return FitReason("merged_copy_too_big", budget, needs_bytes=peaks(s, rollout_weights="merged_copy"))
