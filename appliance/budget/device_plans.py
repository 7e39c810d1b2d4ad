"""The memory plan per device of a job's `resources:`: one plan for each student rank and each judge shard.

A student rank is planned as the whole job with its share of the step's
prompts (and the judge colocated when the judge has no devices of its own);
under FSDP-QLoRA its base is a shard. A judge device holds 1/TP of the
judge's weights and KV cache under vLLM tensor parallelism. `appliance plan
--json` lists them as `devices`; a job that does not fit names the device and component.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from appliance.budget import components
from appliance.budget.device_probe import DeviceInfo
from appliance.budget.plan import Plan, budget_of, plan_job
from appliance.budget.reasons import FitReason
from appliance.budget.shapes import shape_from_config
from appliance.budget.workload import judge_prompt_tokens, resolve_compute_dtype, resolve_engine
from appliance.config.schema import JobSpec
from appliance.config.sizes import format_bytes


@dataclass(frozen=True)
class DevicePlan:
    """What one device holds: a student rank (with its Plan) or one tensor-parallel shard of the judge."""

    node: int
    index: int  # the device on its box
    role: str  # "student" | "judge"
    rank: int | None  # the student's data-parallel rank; None on a judge device
    components: dict[str, int]
    budget_bytes: int
    sharding: str = ""  # student: ddp | fsdp
    tensor_parallel: int = 1  # judge: TP size
    judge_batch: int = 0  # judge: sequences in flight the KV cache holds
    plan: Plan | None = None  # student: the full phase plan

    @property
    def peak_bytes(self) -> int:
        return self.plan.peak_bytes if self.plan is not None else sum(self.components.values())

    @property
    def fits(self) -> bool:
        return self.plan.fits if self.plan is not None else self.peak_bytes <= self.budget_bytes

    def to_dict(self) -> dict:
        out = {
            "node": self.node,
            "index": self.index,
            "role": self.role,
            "rank": self.rank,
            "components": dict(self.components),
            "peak_bytes": self.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "fits": self.fits,
        }
        if self.role == "student":
            out["sharding"] = self.sharding
            out["plan"] = self.plan.to_dict()
        else:
            out.update(tensor_parallel=self.tensor_parallel, judge_batch=self.judge_batch)
        return out

    def refusal(self) -> str:
        where = f"device {self.index}" + (f" of node {self.node}" if self.node else "")
        if self.plan is not None:
            return f"{where} (student rank {self.rank}): {self.plan.refusal()}"
        largest = max(self.components, key=self.components.get)
        return (
            f"{where} (judge, 1/{self.tensor_parallel} of it under tensor parallelism) needs "
            f"{format_bytes(self.peak_bytes)}, more than the {format_bytes(self.budget_bytes)} budget "
            f"(largest: {largest} {format_bytes(self.components[largest])}); raise resources.judge_gpus, "
            "or set judge.quantization: nf4"
        )


def rank_job(job: JobSpec) -> JobSpec:
    """The job one student rank runs: its share of the prompts; the judge only when it is colocated."""
    resources = job.resources
    # job_checks refuses prompts that do not split evenly over the ranks; max(1, ...) keeps an unchecked job's
    # plan from counting zero prompts a rank.
    grpo = job.grpo.model_copy(update={"prompts_per_step": max(1, job.grpo.prompts_per_step // resources.world_size)})
    update = {"grpo": grpo}
    if resources.judge_gpus:  # the judge has devices of its own: the student's ranks hold none of it
        update["judge"] = None
    return job.model_copy(update=update)


def plan_rank(
    job: JobSpec, student_config: dict, judge_config: dict | None, device: DeviceInfo, prompt_tokens: int | None = None
) -> Plan:
    """What each student device holds: the job's plan for one rank, with its sharding decided and why.

    The base stays whole on every rank (ddp) unless the job sets `resources.sharding: fsdp`, or sets `auto`
    and a rank with the whole base would not fit: then it is sharded over the ranks (FSDP-QLoRA).
    """
    resources, one_rank = job.resources, rank_job(job)
    device = box_share(device, resources.student_devices)
    # A whole base on every rank is tried first: DDP needs no gathers, so it is kept whenever it fits.
    plan = plan_job(one_rank, student_config, judge_config, device, prompt_tokens=prompt_tokens)
    if resources.sharding != "auto":
        reason = FitReason("set_in_job", note="resources.sharding")
        sharding = resources.sharding
    elif resources.world_size > 1 and not plan.fits:
        reason = FitReason(
            "whole_base_too_big", plan.budget_bytes, size=resources.world_size, needs_bytes=plan.peak_bytes
        )
        sharding = "fsdp"
    else:
        reason = FitReason("whole_base_fits", plan.budget_bytes, size=resources.world_size)
        sharding = "ddp"
    if sharding == "fsdp":
        plan = plan_job(
            one_rank,
            student_config,
            judge_config,
            device,
            prompt_tokens=prompt_tokens,
            student_shards=resources.world_size,
        )
    if resources.world_size == 1 and resources.sharding == "auto":
        return plan  # one rank: nothing to shard over, nothing to say
    choices = replace(plan.choices, sharding=sharding, reasons={**plan.choices.reasons, "sharding": reason})
    return replace(plan, choices=choices)


def box_share(device: DeviceInfo, ranks_on_box: int) -> DeviceInfo:
    """The part of `device` one of a box's ranks is planned against: a GPU is the rank's own; the CPU's memory is
    the box's, which every rank on it shares, so each is planned against its share."""
    if device.kind != "cpu" or ranks_on_box <= 1:
        return device
    return replace(device, total_bytes=device.total_bytes // ranks_on_box, used_bytes=device.used_bytes // ranks_on_box)


def plan_devices(
    job: JobSpec,
    student_config: dict,
    judge_config: dict | None,
    device: DeviceInfo,
    prompt_tokens: int | None = None,
) -> list[DevicePlan]:
    """One DevicePlan per device of every node (the judge spans its devices on every node)."""
    resources = job.resources
    plan = plan_rank(job, student_config, judge_config, device, prompt_tokens)
    sharding = plan.choices.sharding
    judge = _judge_device(job, judge_config, device) if resources.judge_gpus else None
    plans = []
    for node in range(resources.nodes):
        for index in range(resources.student_devices):
            rank = node * resources.student_devices + index  # ranks count the student devices of node 0 first
            plans.append(
                DevicePlan(node, index, "student", rank, dict(plan.components), plan.budget_bytes, sharding, plan=plan)
            )
        for offset in range(resources.judge_gpus):
            plans.append(replace(judge, node=node, index=resources.student_devices + offset))
    return plans


def _judge_device(job: JobSpec, judge_config: dict | None, device: DeviceInfo) -> DevicePlan:
    """One of the judge's shards: weights and the KV cache of the step's judge calls over TP x PP (halved to fit)."""
    if judge_config is None:
        raise ValueError(f"judge.model: no config.json for '{job.judge.model}' to plan with")
    # vLLM: tensor parallel over the judge's devices (engines/vllm_args.judge_settings).
    tp = job.resources.judge_gpus
    shape = shape_from_config(judge_config, job.judge.model)
    # The judge computes in the student's dtype: one compute dtype per job.
    dtype = components.DTYPE_BYTES[resolve_compute_dtype(job.student.compute_dtype, device.kind)]
    weights = -(-components.weights_bytes(shape, job.judge.quantization, dtype) // tp)
    calls = job.grpo.prompts_per_step if job.judge.mode == "group" else job.grpo.prompts_per_step * job.grpo.group_size
    prompt = judge_prompt_tokens(job, job.grpo.max_prompt_tokens)  # a judge device is planned at the job's bound
    tokens = prompt + job.judge.max_new_tokens
    engine = resolve_engine(job.engine.judge, device.kind)
    budget = budget_of(job, device)

    def sized(batch: int) -> dict[str, int]:
        parts = {
            "judge_weights": weights,
            "judge_kv": -(-components.kv_cache_bytes(shape, batch, tokens, dtype) // tp),
            "activations": -(
                -components.generation_working_bytes(shape, batch, prompt, dtype, engine, 0, device.kind) // tp
            ),
        }
        parts["runtime"] = components.runtime_bytes(device.kind, 1, sum(parts.values()))
        return parts

    # The step's judge calls at once if they fit, else halved until they do (or one call is left to refuse).
    batch = calls
    while batch > 1 and sum(sized(batch).values()) > budget:
        batch //= 2
    return DevicePlan(0, 0, "judge", None, sized(batch), budget, tensor_parallel=tp, judge_batch=batch)


def refusal(devices: list[DevicePlan]) -> str:
    """The first device that does not fit, named with its component; empty when all fit."""
    for plan in devices:
        if not plan.fits:
            return plan.refusal()
    return ""
