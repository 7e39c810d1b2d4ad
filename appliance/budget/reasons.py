"""Why the auto-fit chose each value, as data (`FitReason`), and `describe`, which words it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from appliance.config.sizes import format_bytes

ReasonKind = Literal[
    "set_in_job",  # note: the job-file key
    "nothing_fits",
    "all_fit",  # size: how many there are
    "larger_needs",  # larger: the next larger size, needs_bytes: its peak
    "rounded_up",  # size: sequences per step, larger: the micro-batch
    "checkpointing_needed",  # size: micro-batch, needs_bytes: its peak without checkpointing
    "checkpointing_faster",  # the same, when it would fit but a larger checkpointed micro-batch is faster
    "activations_fit",
    "vllm_copy",  # needs_bytes: vLLM's copy of the student
    "merged_copy_fits",  # needs_bytes: the copy, note: its dtype
    "merged_copy_too_big",  # needs_bytes: the peak with a merged copy
    "awake_too_big",  # needs_bytes: the peak with every engine awake
    "all_awake",
    "assumed",  # size: the sequence tokens, note: what was assumed
    "whole_base_fits",  # size: the ranks
    "whole_base_too_big",  # size: the ranks, needs_bytes: a rank's peak with the whole base
]

# What the batch sizes count, for "sequences generated at once: ...".
COUNTS = {
    "micro_batch_size": "sequences per forward/backward",
    "rollout_batch": "sequences generated at once",
    "judge_batch": "judge calls at once",
}


@dataclass(frozen=True)
class FitReason:
    kind: ReasonKind
    budget_bytes: int = 0
    size: int | None = None
    larger: int | None = None
    needs_bytes: int | None = None
    note: str = ""


def describe(choice: str, reason: FitReason) -> str:
    """One line of English for the reason behind `choice` (a FitChoices field)."""
    budget = f"the {format_bytes(reason.budget_bytes)} budget"
    needs = format_bytes(reason.needs_bytes) if reason.needs_bytes is not None else ""
    count = COUNTS.get(choice, "")
    match reason.kind:
        case "set_in_job":
            return f"set by {reason.note} in the job"
        case "nothing_fits":
            return f"nothing fits {budget}; the smallest configuration is shown"
        case "all_fit":
            return f"{count}: all {reason.size} at once fit"
        case "larger_needs":
            return f"{count}: {reason.larger} would need {needs} > {budget}"
        case "rounded_up":
            return f"{reason.size} sequences per step / micro-batch {reason.larger}, rounded up"
        case "checkpointing_needed":
            return f"on: without it micro-batch {reason.size} needs {needs} > {budget}"
        case "checkpointing_faster":
            return f"on: without it micro-batch {reason.size} needs {needs}, and a larger checkpointed micro-batch trains faster"
        case "activations_fit":
            return "off: the activations of the micro-batch fit without recomputation"
        case "vllm_copy":
            return f"vLLM holds its own copy of the student ({needs})"
        case "merged_copy_fits":
            return f"merged_copy: a separate {reason.note} copy of the student ({needs}) fits and generates faster than 4-bit weights"
        case "merged_copy_too_big":
            return f"shared: a merged copy would need {needs} > {budget} at these batch sizes"
        case "awake_too_big":
            return (
                f"on: with every engine awake the step needs {needs} > {budget} at these batch sizes; "
                "each phase alone fits, idle engines sleep"
            )
        case "all_awake":
            return "off: every engine stays awake within the budget (no wake/sleep per step)"
        case "assumed":
            return f"{reason.size}: {reason.note}"
        case "whole_base_fits":
            return f"ddp: each of the {reason.size} ranks holds the whole base within {budget}"
        case "whole_base_too_big":
            return (
                f"fsdp: with the whole base a rank needs {needs} > {budget}, so the base is sharded over "
                f"the {reason.size} ranks"
            )
    raise ValueError(f"no wording for the fit reason {reason.kind!r}")
