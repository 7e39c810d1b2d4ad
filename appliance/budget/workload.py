"""The job as the memory arithmetic sees it: shapes, dtypes, engines and token counts.

One place resolves the job file's `auto` values for a device (compute dtype,
engines), so that the planner, the auto-fit and the trainer agree on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.budget.components import DTYPE_BYTES, lora_params
from appliance.budget.shapes import ModelShape, shape_from_config
from appliance.config.schema import JobSpec
from appliance.conventions import planned_result_tokens


# The judge's instructions around the rubric (judge/prompts.py), in tokens; rubric text at ~4 characters a token.
JUDGE_TEMPLATE_TOKENS = 160
CHARACTERS_PER_TOKEN = 4
# Agent jobs (task.environment): a trajectory is the opening prompt, then per turn the assistant's reply
# (at most grpo.max_new_tokens) and what follows it before the next reply: tool results and template glue,
# at most the environment's result_tokens (conventions.py). Turns: task.max_turns, else
# AGENT_TURNS_ASSUMED. Longer trajectories are cut at this bound by the trainer (grpo/trajectories.py), so
# the plan holds.
AGENT_TURNS_ASSUMED = 4


def agent_turns(job: JobSpec) -> int:
    return job.task.max_turns or AGENT_TURNS_ASSUMED


def result_tokens(job: JobSpec) -> int:
    """Tokens per turn an agent job's plan allows after each reply."""
    return planned_result_tokens(job.task.environment)


def generated_tokens(job: JobSpec) -> int:
    """Tokens after the prompt of one sequence: a completion, or an agent trajectory after its opening."""
    if job.task.environment is None:
        return job.grpo.max_new_tokens
    return agent_turns(job) * (job.grpo.max_new_tokens + result_tokens(job))


def assumptions(job: JobSpec) -> str:
    """What the plan assumes about sequence lengths, in words (empty for single-turn jobs)."""
    if job.task.environment is None:
        return ""
    source = "task.max_turns" if job.task.max_turns else "assumed; set task.max_turns to plan another limit"
    return (
        f"agent trajectories: opening prompt + {agent_turns(job)} turns ({source}) x (grpo.max_new_tokens "
        f"{job.grpo.max_new_tokens} + {result_tokens(job)} tokens of tool result and template); longer "
        "trajectories are cut there"
    )


@dataclass(frozen=True)
class Workload:
    device_kind: str
    compute_dtype: str
    student: ModelShape
    student_quantization: str
    lora_rank: int
    lora_targets: tuple[str, ...]
    trainable_params: int
    judge: ModelShape | None
    judge_quantization: str
    judge_shares_student: bool
    # Sequences generated per step (prompts_per_step x group_size) and their lengths.
    sequences: int
    prompt_tokens: int
    new_tokens: int
    # Judge calls per step and tokens per call (its prompt carries the completions it scores).
    judge_calls: int
    judge_prompt_tokens: int
    judge_new_tokens: int
    rollout_engine: str  # "hf" | "vllm"
    judge_engine: str
    optimizer: str = "adamw_32bit"
    double_quant: bool = False
    # FSDP-QLoRA: the student's base sharded over this many ranks (1: a whole copy per device, DDP).
    student_shards: int = 1
    # vLLM's copy of the student tensor-parallel over this many ranks (engine.vllm.tensor_parallel_size).
    rollout_tensor_parallel: int = 1
    # Completions per prompt: the update runs a group's shared prompt once.
    group_size: int = 1
    # A transformers merged rollout copy's dtype (resolve_rollout_dtype); "" for the compute dtype.
    rollout_copy_dtype: str = ""

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.compute_dtype]

    @property
    def copy_dtype(self) -> str:
        return self.rollout_copy_dtype or self.compute_dtype

    @property
    def sequence_tokens(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def judge_tokens(self) -> int:
        return self.judge_prompt_tokens + self.judge_new_tokens

    @property
    def engine_processes(self) -> int:
        """Processes holding a device context: the trainer, plus one per vLLM engine."""
        engines = {self.rollout_engine} if self.rollout_engine == "vllm" else set()
        if self.judge is not None and self.judge_engine == "vllm" and not self.judge_shares_student:
            engines.add("vllm-judge")
        return 1 + len(engines)


def resolve_compute_dtype(setting: str, device_kind: str) -> str:
    """auto: bf16 on CUDA, fp32 on the CPU (bf16 is many times slower without bf16 units)."""
    if setting != "auto":
        return setting
    return "bfloat16" if device_kind == "cuda" else "float32"


def resolve_rollout_dtype(setting: str, compute_dtype: str, device_kind: str, bf16_matmul: bool) -> str:
    """A merged copy's dtype: auto is bf16 for an fp32 student on a CPU with bf16 instructions (twice the
    decode speed at half the bytes; the trainer corrects the sampler's rounding by importance sampling)."""
    if setting == "bfloat16" or (
        setting == "auto" and device_kind == "cpu" and compute_dtype == "float32" and bf16_matmul
    ):
        return "bfloat16"
    return compute_dtype


def resolve_engine(setting: str, device_kind: str) -> str:
    """auto: vLLM on CUDA, transformers on the CPU."""
    if setting != "auto":
        return setting
    return "vllm" if device_kind == "cuda" else "hf"


def judge_engine_of(job: JobSpec, device_kind: str) -> str:
    """A local judge's engine: engine.judge, where auto is vLLM on CUDA, except a judge colocated with each of
    several ranks, which runs on transformers (vLLM runs once per rank, as the student's engine)."""
    colocated_on_ranks = job.resources.world_size > 1 and not job.resources.judge_gpus
    if colocated_on_ranks and job.engine.judge == "auto":
        return "hf"
    return resolve_engine(job.engine.judge, device_kind)


def judge_prompt_tokens(job: JobSpec, prompt_tokens: int) -> int:
    """Tokens of one judge prompt: the rubric and template, the task prompt, and the completion(s) it scores.

    In group mode one call carries the whole group's completions.
    """
    grpo = job.grpo
    generated = generated_tokens(job)
    scored = grpo.group_size * generated if job.judge.mode == "group" else generated
    rubric = len(job.judge.rubric or "") // CHARACTERS_PER_TOKEN + JUDGE_TEMPLATE_TOKENS
    return prompt_tokens + scored + rubric


def workload_of(
    job: JobSpec,
    student_config: dict,
    judge_config: dict | None,
    device_kind: str,
    optimizer: str = "adamw_32bit",
    double_quant: bool = False,
    prompt_tokens: int | None = None,
    bf16_matmul: bool = False,
) -> Workload:
    """prompt_tokens: the longest training prompt as measured (job.prompt_lengths); else grpo.max_prompt_tokens.
    bf16_matmul: the device multiplies bf16 in hardware (DeviceInfo), for engine.rollout_dtype auto."""
    student = shape_from_config(student_config, job.student.model)
    # Without measured prompts (no dataset at hand) the job's bound, which the trainer truncates prompts to.
    prompt_tokens = prompt_tokens or job.grpo.max_prompt_tokens
    targets = tuple(job.student.lora.target_modules)
    grpo = job.grpo
    sequences = grpo.prompts_per_step * grpo.group_size
    judge_shape, judge_quant, shares, calls, judge_prompt, judge_new = None, "none", False, 0, 0, 0
    rollout_engine = resolve_engine(job.engine.rollout, device_kind)
    judge_engine = rollout_engine  # a judge on the student's base generates through the rollout engine
    if job.judge is not None and job.judge.endpoint is None:  # a judge at an endpoint holds no memory here
        shares = job.judge.share_student_base
        if shares:
            judge_shape, judge_quant = student, job.student.quantization
        else:
            if judge_config is None:
                raise ValueError(f"judge.model: no config.json for '{job.judge.model}' to plan with")
            judge_shape, judge_quant = shape_from_config(judge_config, job.judge.model), job.judge.quantization
            judge_engine = judge_engine_of(job, device_kind)
        judge_new = job.judge.max_new_tokens
        calls = grpo.prompts_per_step if job.judge.mode == "group" else sequences  # group: one call per group
        judge_prompt = judge_prompt_tokens(job, prompt_tokens)
    compute_dtype = resolve_compute_dtype(job.student.compute_dtype, device_kind)
    return Workload(
        device_kind=device_kind,
        compute_dtype=compute_dtype,
        student=student,
        student_quantization=job.student.quantization,
        lora_rank=job.student.lora.rank,
        lora_targets=targets,
        trainable_params=lora_params(student, job.student.lora.rank, list(targets)),
        judge=judge_shape,
        judge_quantization=judge_quant,
        judge_shares_student=shares,
        sequences=sequences,
        prompt_tokens=prompt_tokens,
        new_tokens=generated_tokens(job),
        judge_calls=calls,
        judge_prompt_tokens=judge_prompt,
        judge_new_tokens=judge_new,
        rollout_engine=rollout_engine,
        judge_engine=judge_engine,
        optimizer=optimizer,
        double_quant=double_quant,
        group_size=grpo.group_size,
        rollout_tensor_parallel=job.engine.vllm.tensor_parallel_size if job.resources.world_size > 1 else 1,
        rollout_copy_dtype=resolve_rollout_dtype(job.engine.rollout_dtype, compute_dtype, device_kind, bf16_matmul),
    )
