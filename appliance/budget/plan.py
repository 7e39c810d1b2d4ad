"""The memory plan of a job on a device: per-phase residency, peak, fit, and what to change.

`plan_job` is what the trainer, the daemon (admission at submit) and
`appliance plan` call. When the job does not fit, the suggested changes are
found by re-planning the job with each change applied, so every suggestion
is one that the planner itself says fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from appliance.budget.device_probe import DeviceInfo
from appliance.budget.fit import auto_fit
from appliance.budget.phase_memory import COMPONENTS, FitChoices, PhasePlan
from appliance.budget.reasons import FitReason
from appliance.budget.workload import Workload, assumptions, workload_of
from appliance.config.schema import JobSpec
from appliance.config.sizes import format_bytes, parse_memory_budget

# A combination of more changes than this is not offered: the job would be another job.
MAX_COMBINED_CHANGES = 6


@dataclass(frozen=True)
class Plan:
    device: DeviceInfo
    budget_bytes: int
    components: dict[str, int]  # planned bytes per component (its largest residency over the phases)
    phases: dict[str, PhasePlan]
    peak_bytes: int
    fits: bool
    choices: FitChoices
    overflow: list[str]  # components of the over-budget phase that together exceed the budget, largest first
    suggestions: list[str]  # job-file changes that would fit, e.g. "grpo.group_size: 4"
    compute_dtype: str = ""
    rollout_engine: str = ""
    judge_engine: str = ""
    # Longest sequence (prompt + generated tokens) per role: vLLM's max_model_len.
    sequence_tokens: dict = field(default_factory=dict)
    rollout_dtype: str = ""  # a transformers merged copy's (workload.resolve_rollout_dtype)

    def to_dict(self) -> dict:
        return {
            "device": self.device.to_dict(),
            "budget_bytes": self.budget_bytes,
            "compute_dtype": self.compute_dtype,
            "rollout_dtype": self.rollout_dtype,
            "engines": {"rollout": self.rollout_engine, "judge": self.judge_engine},
            "components": dict(self.components),
            "phases": {name: phase.to_dict() for name, phase in self.phases.items()},
            "peak_bytes": self.peak_bytes,
            "fits": self.fits,
            "choices": self.choices.to_dict(),
            "overflow": list(self.overflow),
            "suggestions": list(self.suggestions),
        }

    def refusal(self) -> str:
        """One sentence for stderr or an API error: why the job is refused and what to change."""
        if self.fits:
            return ""
        worst = max(self.phases.values(), key=lambda p: p.peak_bytes)
        change = (
            "change " + " or ".join(self.suggestions)
            if self.suggestions
            else "no change to the job fits; use a larger device or a smaller model"
        )
        return (
            f"the {worst.name} phase needs {format_bytes(worst.peak_bytes)}, more than the "
            f"{format_bytes(self.budget_bytes)} budget (overflowing: {', '.join(self.overflow)}); {change}"
        )

    def render(self) -> str:
        """The plan for people: one column per phase, GiB on screen."""
        names = list(self.phases)
        gib = format_bytes
        lines = [
            f"device {self.device.kind} {self.device.name}".rstrip()
            + f": {gib(self.device.total_bytes)} total, budget {gib(self.budget_bytes)}",
            f"compute dtype {self.compute_dtype}, rollout engine {self.rollout_engine}"
            + (f", judge engine {self.judge_engine}" if "judge" in self.phases else "")
            + (", judge at a remote endpoint (no memory on this device)" if self.judge_engine == "remote" else ""),
            "",
            f"{'component':<18}" + "".join(f"{name:>13}" for name in names),
        ]
        for component in COMPONENTS:
            row = [self.phases[name].resident[component] for name in names]
            if any(row):
                lines.append(f"{component:<18}" + "".join(f"{gib(value) if value else '-':>13}" for value in row))
        lines.append(f"{'peak':<18}" + "".join(f"{gib(self.phases[name].peak_bytes):>13}" for name in names))
        lines.append("")
        c = self.choices
        # The fit's reason says when vLLM generates from its own copy, whatever the transformers setting.
        weights_reason = c.reasons.get("rollout_weights")
        weights = "vllm_copy" if weights_reason and weights_reason.kind == "vllm_copy" else c.rollout_weights
        if weights == "merged_copy" and self.rollout_dtype:
            weights += f" ({self.rollout_dtype})"
        lines.append(
            f"choices: micro_batch_size {c.micro_batch_size} x grad_accumulation {c.grad_accumulation}, "
            f"gradient_checkpointing {'on' if c.gradient_checkpointing else 'off'}, rollout_weights {weights}, "
            f"time_share {'on' if c.time_share else 'off'}, rollout batch {c.rollout_batch} "
            f"(KV {gib(c.rollout_kv_bytes)})"
            + (f", judge batch {c.judge_batch} (KV {gib(c.judge_kv_bytes)})" if "judge" in self.phases else "")
        )
        for key, reason in c.worded_reasons().items():
            lines.append(f"  {key}: {reason}")
        lines.append("")
        if self.fits:
            lines.append(f"fits: peak {gib(self.peak_bytes)} of the {gib(self.budget_bytes)} budget")
        else:
            worst = max(self.phases.values(), key=lambda p: p.peak_bytes)
            lines.append(
                f"does not fit: the {worst.name} phase needs {gib(worst.peak_bytes)} of the {gib(self.budget_bytes)} "
                f"budget (over by {gib(worst.peak_bytes - self.budget_bytes)})"
            )
            lines.append("overflowing: " + ", ".join(f"{n} {gib(worst.resident[n])}" for n in self.overflow))
            if self.suggestions:
                lines.append("changes that would fit (each alone, or together where joined by ' + '):")
                lines.extend(f"  {s}" for s in self.suggestions)
            else:
                lines.append("no change to the job fits this budget: use a larger device or a smaller model")
        return "\n".join(lines)


def budget_of(job: JobSpec, device: DeviceInfo) -> int:
    # A size above the device (a budget written for another box) is capped at what the device has.
    return min(parse_memory_budget(job.device.memory_budget, device.total_bytes), device.total_bytes)


def _fit(job: JobSpec, work: Workload, budget: int):
    return auto_fit(
        work, budget, job.grpo.micro_batch_size, job.student.gradient_checkpointing, job.engine.rollout_weights
    )


def _peak(phases: dict[str, PhasePlan]) -> int:
    return max(p.peak_bytes for p in phases.values())


def plan_job(
    job: JobSpec,
    student_config: dict,
    judge_config: dict | None,
    device: DeviceInfo,
    optimizer: str = "adamw_32bit",
    double_quant: bool = False,
    prompt_tokens: int | None = None,
    student_shards: int = 1,
) -> Plan:
    """Plan `job` on `device`: auto-fit choices, per-phase peaks and, when it does not fit, what to change.

    prompt_tokens: the job's longest training prompt as measured with the chat template
    (job.prompt_lengths); without it the plan assumes grpo.max_prompt_tokens.
    student_shards: FSDP-QLoRA ranks the student's base is sharded over (budget/device_plans.py).
    """
    budget = budget_of(job, device)
    work = workload_of(
        job, student_config, judge_config, device.kind, optimizer, double_quant, prompt_tokens, device.bf16_matmul
    )
    # The FSDP sharding is the launcher's decision, not the job file's, so it is set on the workload here.
    work = replace(work, student_shards=student_shards)
    choices, phases = _fit(job, work, budget)
    # Agent jobs plan assumed trajectory lengths: said beside the choices they drove.
    if assumptions(job):
        choices.reasons["sequence_tokens"] = FitReason("assumed", size=work.sequence_tokens, note=assumptions(job))
    peak = _peak(phases)
    fits = peak <= budget
    components = {name: max(p.resident[name] for p in phases.values()) for name in COMPONENTS}
    overflow, suggestions = [], []
    if not fits:  # suggestions re-plan the job many times: only a refused plan pays for them
        overflow = _overflow(phases, budget)
        suggestions = suggest_changes(
            job, student_config, judge_config, device, optimizer, double_quant, prompt_tokens, student_shards
        )
    return Plan(
        device,
        budget,
        components,
        phases,
        peak,
        fits,
        choices,
        overflow,
        suggestions,
        work.compute_dtype,
        work.rollout_engine,
        ("remote" if job.judge.endpoint else work.judge_engine) if job.judge else "",
        {"student": work.sequence_tokens, **({"judge": work.judge_tokens} if job.judge else {})},
        work.copy_dtype,
    )


def _overflow(phases: dict[str, PhasePlan], budget: int) -> list[str]:
    """The largest components of the worst phase whose bytes together cover its excess."""
    worst = max(phases.values(), key=lambda p: p.peak_bytes)
    excess, names = worst.peak_bytes - budget, []
    # Largest first, so the list names the fewest components that explain the excess.
    for name, size in sorted(worst.resident.items(), key=lambda item: -item[1]):
        if excess <= 0 or size == 0:
            break
        names.append(name)
        excess -= size
    return names


# ---- suggestions: re-plan the job with one change at a time -------------------------------------------------


def _replace(job: JobSpec, key: str, value) -> JobSpec:
    section, field = key.split(".", 1)
    part = getattr(job, section)
    return job.model_copy(update={section: part.model_copy(update={field: value})})


def _halved(value: int, floor: int) -> list[int]:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def _knobs(job: JobSpec) -> list[tuple[str, list]]:
    """Job-file keys that reduce memory, each with its values from the mildest change to the strongest."""
    g = job.grpo
    knobs = [
        ("grpo.group_size", _halved(g.group_size, 2)),  # a group of one has no advantage to learn from
        ("grpo.prompts_per_step", _halved(g.prompts_per_step, 1)),
        ("grpo.max_new_tokens", _halved(g.max_new_tokens, 32)),
        ("grpo.max_prompt_tokens", _halved(g.max_prompt_tokens, 64)),
    ]
    if job.student.quantization == "none":
        knobs.append(("student.quantization", ["nf4"]))
    if job.student.gradient_checkpointing is False:
        knobs.append(("student.gradient_checkpointing", [True]))
    if g.micro_batch_size and g.micro_batch_size > 1:
        knobs.append(("grpo.micro_batch_size", _halved(g.micro_batch_size, 1)))
    if job.engine.rollout_weights == "merged_copy":
        knobs.append(("engine.rollout_weights", ["shared"]))
    # A judge at an endpoint costs this device nothing, and one sharing the student's base has no weights of
    # its own to shrink.
    if job.judge is not None and not job.judge.share_student_base and job.judge.endpoint is None:
        if job.judge.quantization != "nf4":
            knobs.append(("judge.quantization", ["nf4"]))
        if job.judge.model == job.student.model:  # only the same model can share the student's weights
            knobs.append(("judge.share_student_base", [True]))
    if job.judge is not None and job.judge.endpoint is None:
        knobs.append(("judge.max_new_tokens", _halved(job.judge.max_new_tokens, 16)))
    return [(key, values) for key, values in knobs if values]


def _format(key: str, value) -> str:
    return f"{key}: {str(value).lower() if isinstance(value, bool) else value}"


def suggest_changes(
    job: JobSpec,
    student_config: dict,
    judge_config: dict | None,
    device: DeviceInfo,
    optimizer: str = "adamw_32bit",
    double_quant: bool = False,
    prompt_tokens: int | None = None,
    student_shards: int = 1,
) -> list[str]:
    """Single changes that fit (the mildest value of each key), else one combination found greedily."""
    budget = budget_of(job, device)

    def peak_with(candidate: JobSpec) -> int:
        # A smaller grpo.max_prompt_tokens than the measured prompts means truncating them.
        measured = min(prompt_tokens, candidate.grpo.max_prompt_tokens) if prompt_tokens else None
        work = workload_of(
            candidate, student_config, judge_config, device.kind, optimizer, double_quant, measured, device.bf16_matmul
        )
        work = replace(work, student_shards=student_shards)
        return _peak(_fit(candidate, work, budget)[1])

    singles = []
    for key, values in _knobs(job):
        for value in values:  # mildest first: the first that fits is the one suggested for this key
            if peak_with(_replace(job, key, value)) <= budget:
                singles.append(_format(key, value))
                break
    if singles:
        return singles
    # No single change is enough: take, step by step, the one-step change that lowers the peak most.
    current, chosen = job, {}
    # A key may be halved again in a later round and still count as one change, hence more rounds than changes.
    for _ in range(MAX_COMBINED_CHANGES * 3):
        steps = [(peak_with(_replace(current, key, values[0])), key, values[0]) for key, values in _knobs(current)]
        if not steps:
            return []
        peak, key, value = min(steps, key=lambda step: step[0])
        current, chosen[key] = _replace(current, key, value), value
        if peak <= budget:
            if len(chosen) > MAX_COMBINED_CHANGES:
                return []
            return [" + ".join(_format(k, v) for k, v in chosen.items())]
    return []
