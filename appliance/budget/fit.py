"""Auto-fit: the batch sizes, checkpointing, rollout weights and time-sharing that fit a budget.

The open choices are searched with cheap arithmetic (see `candidates`) and the
best plan that fits is kept. "Best" ranks what costs the most
time first: a bigger rollout batch (generation dominates a GRPO step), then a
bigger judge batch, then training throughput (micro-batch tokens up to about
16k, past which a GPU is saturated; checkpointing costs about a third more
compute), then keeping every engine awake (sleep and wake cost seconds per
step, less than a starved trainer), and last a merged rollout copy of the
weights (faster generation, worth the memory once nothing more important
needs it). Values the
job file sets are taken as given. Each choice records why it was made.
"""

from __future__ import annotations

import itertools
import math

from appliance.budget.phases import FitChoices, PhasePlan, Sizing, phase_plans
from appliance.budget.workload import Workload
from appliance.config.sizes import format_bytes

CHECKPOINTING_COMPUTE_COST = 0.75  # throughput kept with gradient checkpointing (one extra forward)
SATURATING_MICRO_BATCH_TOKENS = 16384


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


def _rank(s: Sizing, sequence_tokens: int) -> tuple:
    # Past ~16k tokens a micro-batch no longer speeds training up; a merged copy still speeds generation.
    tokens = min(s.micro_batch_size * sequence_tokens, SATURATING_MICRO_BATCH_TOKENS)
    train = tokens * (CHECKPOINTING_COMPUTE_COST if s.gradient_checkpointing else 1.0)
    return (s.rollout_batch, s.judge_batch, train, not s.time_share, s.rollout_weights == "merged_copy")


def _largest(values: list[int], fits) -> int | None:
    """The first (largest) value for which fits(value) holds; memory only grows with each size."""
    for value in values:
        if fits(value):
            return value
    return None


def candidates(
    work: Workload, budget_bytes: int, micro_batch: int | None, checkpointing: bool | None, rollout_weights: str
):
    """For each setting of the yes/no choices, the largest batch sizes that fit, in order of importance.

    Peaks grow with every batch size, so maximizing the rollout batch (with the
    other batches at their smallest), then the judge batch, then the micro-batch
    finds the same best plan as trying every combination.
    """
    micro_batches = [micro_batch] if micro_batch else halvings(work.sequences)
    checkpointings = [checkpointing] if checkpointing is not None else [False, True]
    weights = [rollout_weights] if rollout_weights != "auto" else ["merged_copy", "shared"]
    if work.rollout_engine == "vllm":  # vLLM holds its own copy whatever the setting: one candidate
        weights = weights[:1]
    judge_batches = halvings(work.judge_calls) if work.judge is not None else [0]
    for ts, w, gc in itertools.product((False, True), weights, checkpointings):

        def fits(rb: int, jb: int, mb: int) -> bool:
            return peak_of(phase_plans(work, Sizing(mb, gc, w, ts, rb, jb))) <= budget_bytes

        smallest_mb, smallest_jb = micro_batches[-1], judge_batches[-1]
        rb = _largest(halvings(work.sequences), lambda value: fits(value, smallest_jb, smallest_mb))
        if rb is None:
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
    planned = [
        (s, phase_plans(work, s)) for s in candidates(work, budget_bytes, micro_batch, checkpointing, rollout_weights)
    ]
    fitting = [(s, p) for s, p in planned if peak_of(p) <= budget_bytes]
    if fitting:
        sizing, phases = max(fitting, key=lambda item: _rank(item[0], work.sequence_tokens))
    else:
        # Nothing fits: show the configuration that needs least, in its worst phase and then overall.
        sizing, phases = min(planned, key=lambda item: (peak_of(item[1]), sum(p.peak_bytes for p in item[1].values())))
    reasons = _reasons(work, sizing, phases, budget_bytes, bool(fitting), micro_batch, checkpointing, rollout_weights)
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


def _with(work: Workload, s: Sizing, **change) -> int:
    """Peak of the same plan with one choice changed."""
    fields = dict(
        micro_batch_size=s.micro_batch_size,
        gradient_checkpointing=s.gradient_checkpointing,
        rollout_weights=s.rollout_weights,
        time_share=s.time_share,
        rollout_batch=s.rollout_batch,
        judge_batch=s.judge_batch,
    )
    fields.update(change)
    return peak_of(phase_plans(work, Sizing(**fields)))


def _reasons(
    work: Workload,
    s: Sizing,
    phases: dict[str, PhasePlan],
    budget: int,
    fits: bool,
    micro_batch: int | None,
    checkpointing: bool | None,
    rollout_weights: str,
) -> dict[str, str]:
    gib = format_bytes
    budget_text = f"the {gib(budget)} budget"
    if not fits:
        note = f"nothing fits {budget_text}; the smallest configuration is shown"
        return {
            key: note
            for key in (
                "micro_batch_size",
                "grad_accumulation",
                "gradient_checkpointing",
                "rollout_weights",
                "time_share",
                "rollout_batch",
                "judge_batch",
            )
        }

    def next_size_up(field: str, value: int, limit: int) -> str:
        """Why not the next larger candidate: it would not fit (or there is none)."""
        if value >= limit:
            return f"all {limit} at once fit"
        larger = min(v for v in halvings(limit) if v > value)
        return f"{larger} would need {gib(_with(work, s, **{field: larger}))} > {budget_text}"

    reasons = {}
    if micro_batch:
        reasons["micro_batch_size"] = "set by grpo.micro_batch_size in the job"
    else:
        reasons["micro_batch_size"] = (
            f"sequences per forward/backward: {next_size_up('micro_batch_size', s.micro_batch_size, work.sequences)}"
        )
    reasons["grad_accumulation"] = f"{work.sequences} sequences per step / micro-batch {s.micro_batch_size}, rounded up"
    if checkpointing is not None:
        reasons["gradient_checkpointing"] = "set by student.gradient_checkpointing in the job"
    elif s.gradient_checkpointing:
        without = _with(work, s, gradient_checkpointing=False)
        reasons["gradient_checkpointing"] = f"on: without it micro-batch {s.micro_batch_size} needs {gib(without)}" + (
            f" > {budget_text}" if without > budget else ", and a larger checkpointed micro-batch trains faster"
        )
    else:
        reasons["gradient_checkpointing"] = "off: the activations of the micro-batch fit without recomputation"
    if work.rollout_engine == "vllm":
        reasons["rollout_weights"] = (
            f"vLLM holds its own copy of the student ({gib(phases['generate'].resident['rollout_weights'])})"
        )
    elif rollout_weights != "auto":
        reasons["rollout_weights"] = "set by engine.rollout_weights in the job"
    elif s.rollout_weights == "merged_copy":
        reasons["rollout_weights"] = (
            f"merged_copy: a separate {work.compute_dtype} copy of the student "
            f"({gib(phases['generate'].resident['rollout_weights'])}) fits and generates faster than 4-bit weights"
        )
    else:
        reasons["rollout_weights"] = (
            f"shared: a merged copy would need {gib(_with(work, s, rollout_weights='merged_copy'))} > {budget_text}"
            " at these batch sizes"
        )
    if s.time_share:
        together = _with(work, s, time_share=False)
        reasons["time_share"] = (
            f"on: with every engine awake the step needs {gib(together)} > {budget_text} at these batch sizes; "
            "each phase alone fits, idle engines sleep"
        )
    else:
        reasons["time_share"] = "off: every engine stays awake within the budget (no wake/sleep per step)"
    reasons["rollout_batch"] = (
        f"sequences generated at once: {next_size_up('rollout_batch', s.rollout_batch, work.sequences)}"
    )
    if work.judge is not None:
        reasons["judge_batch"] = f"judge calls at once: {next_size_up('judge_batch', s.judge_batch, work.judge_calls)}"
    return reasons
