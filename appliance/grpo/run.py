"""`run_job`: one GRPO job from a validated spec to its last step, the seam the CLI and the daemon's worker share.

The caller owns the job folder (the CLI's `prepare_job_dir`, the daemon's
jobs/<id>/), decides where this process sits in the job (`world`: the whole
job, or one rank of several) and hears about progress through two callbacks:
`on_step` gets every finished step's StepRecord, `on_event` phase changes,
checkpoints, evaluations, log lines and memory readings. `stop_requested()` is
polled between steps; when it returns a reason the run makes sure the last
finished step is checkpointed and returns `RunResult(status="stopped")`.
Engines are released in a `finally`, so one process can run several jobs in
turn. `build_trainer` sets a run up, one named step a line, planning once.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from appliance.budget.device_plans import plan_rank
from appliance.budget.device_probe import probe_device
from appliance.budget.host_allocator import pin_mmap_threshold, release_freed_heap
from appliance.budget.plan import Plan
from appliance.budget.shapes import load_config
from appliance.config.schema import JobSpec
from appliance.conventions import ENVIRONMENT_REWARD, EXTERNAL_ENVIRONMENT
from appliance.durable import write_atomically
from appliance.engines.hf import HFEngine
from appliance.errors import ApplianceError, StopBeforeStep
from appliance.grpo.distributed import RankInfo, check_resumed_together, one_process
from appliance.grpo.prompt_lengths import longest_opening_tokens, longest_prompt_tokens
from appliance.grpo.step_record import (
    EvalResult,
    EventCallback,
    RunHooks,
    RunResult,
    StepCallback,
    StepRecord,
    StopCallback,
)
from appliance.grpo.student import Student
from appliance.grpo.trainer import Trainer
from appliance.grpo.trajectories import AgentJob, EnvironmentReward
from appliance.job_checks import layout_refusals
from appliance.models.causal_lm import DTYPES, load_tokenizer
from appliance.models.store import resolve_model
from appliance.paths import jobs_dir
from appliance.rewards.registry import WeightedReward, build_rewards
from appliance.tasks.load import load_task
from appliance.tasks.task import Task
from appliance.trackers import Trackers, open_trackers

__all__ = ["EventCallback", "StepCallback", "StopCallback", "run_job"]


def run_job(
    spec: JobSpec,
    data_dir: Path,
    job_dir: Path,
    *,
    job_file_dir: Path,
    world: RankInfo | None = None,
    resume: bool = False,
    evaluate: bool = False,
    eval_limit: int | None = None,
    on_step: StepCallback | None = None,
    on_event: EventCallback | None = None,
    stop_requested: StopCallback | None = None,
) -> RunResult:
    """Train `spec` in `job_dir` until `grpo.steps` or until `stop_requested()` gives a reason.

    world: this process's rank of the job (None: the whole job in this process).
    evaluate: held-out accuracy of the base model before the first step and of
    the trained adapter after the last (the first `eval_limit` problems; None:
    the job's checkpoint.eval_limit), greedy or sampled as the job's
    checkpoint.eval_temperature and checkpoint.eval_samples say.
    """
    stop_requested = stop_requested or (lambda: None)
    steps = _StepSinks(on_step)
    hooks = RunHooks(on_step=steps, on_event=on_event or (lambda event: None))
    # The trainer polls it too: an agent job waiting for submitted trajectories stops without finishing a step.
    trainer = build_trainer(spec, job_file_dir, data_dir, job_dir, world or one_process(), stop_requested, hooks)
    limit = eval_limit if eval_limit is not None else spec.checkpoint.eval_limit
    held_out = _HeldOut(trainer, limit) if evaluate else None
    try:
        _announce(trainer, spec, resume)
        before = held_out(adapter=False, when="before") if held_out is not None and trainer.step == 0 else None
        steps.trackers = open_trackers(spec, trainer.job_dir, trainer.log)
        try:
            while trainer.step < spec.grpo.steps:
                reason = stop_requested()
                if not reason:
                    try:
                        trainer.train_step()
                        continue
                    except StopBeforeStep as interrupted:
                        reason = stop_requested() or str(interrupted)
                trainer.ensure_checkpoint()
                trainer.log(f"stopped at step {trainer.step}: {reason}")
                return RunResult("stopped", trainer.step, reason, trainer.checkpoints.best_state(), before, None)
        finally:
            steps.trackers.close()
        after = held_out(adapter=True, when="after") if held_out is not None else None
        if held_out is not None and held_out.evaluations and trainer.world.is_main:
            trainer.records.evaluations(held_out.evaluations)
        return RunResult("completed", trainer.step, None, trainer.checkpoints.best_state(), before, after)
    finally:
        trainer.close()


class _StepSinks:
    """Every finished step goes to the caller's on_step and, once they are open, to the trackers."""

    def __init__(self, on_step: StepCallback | None):
        self.on_step = on_step
        self.trackers: Trackers | None = None

    def __call__(self, record: StepRecord) -> None:
        if self.on_step is not None:
            self.on_step(record)
        if self.trackers is not None:
            self.trackers.write(record)


class _HeldOut:
    """Held-out evaluations of one run: each announced as an "eval" event, all kept for eval.json."""

    def __init__(self, trainer: Trainer, limit: int | None):
        self.trainer = trainer
        self.limit = limit
        self.evaluations: dict[str, dict] = {}

    def __call__(self, adapter: bool, when: str) -> EvalResult:
        started = time.monotonic()
        evaluation = self.trainer.evaluate_held_out(adapter=adapter, limit=self.limit)
        self.evaluations[when] = evaluation.to_dict()
        result = evaluation.summary()
        self.trainer.on_event("eval", when=when, seconds=time.monotonic() - started, **result.to_dict())
        return result


def _announce(trainer: Trainer, spec: JobSpec, resume: bool) -> None:
    """The plan's memory reading, the resume and the log line that opens the run."""
    plan = trainer.plan
    trainer.on_event(
        "memory",
        planned_bytes=dict(plan.components),
        budget_bytes=plan.budget_bytes,
        planned_peak_bytes=plan.peak_bytes,
        device_total_bytes=plan.device.total_bytes,
        device_used_bytes=plan.device.used_bytes,
    )
    resumed = trainer.resume() if resume else None
    if resume:
        check_resumed_together(trainer.world, resumed)
    if resume and resumed is None:
        trainer.log(f"no checkpoint in {trainer.job_dir / 'checkpoints'}; starting at step 0")
    choices = trainer.choices
    trainer.log(
        f"job '{spec.name}' in {trainer.job_dir}: {spec.grpo.steps} steps, micro-batch "
        f"{trainer.micro_batch_size}, gradient checkpointing {'on' if choices.gradient_checkpointing else 'off'}"
        + (
            ", rollouts on vLLM's own copy"
            if trainer.engine.kind == "vllm"
            else f", rollouts on {choices.rollout_weights} weights"
        )
    )


# ----- the job folder -------------------------------------------------------------------------------------


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


# ----- setting a run up -----------------------------------------------------------------------------------


def build_trainer(
    spec: JobSpec,
    job_file_dir: Path,
    data_dir: Path,
    job_dir: Path,
    world: RankInfo,
    stop_requested: StopCallback | None = None,
    hooks: RunHooks | None = None,
) -> Trainer:
    """The job's trainer for this process, set up in an order that matters (each later step uses the earlier)."""
    if world.world_size != spec.resources.world_size:
        raise JobSetupError(
            f"'{spec.name}' asks for {spec.resources.world_size} data-parallel rank(s) (resources) and this process "
            f"is one of {world.world_size}; start it with 'appliance train' or submit it to the daemon, which launch "
            "one process per rank"
        )
    pin_mmap_threshold()  # before the models load: what a step frees goes back to the OS
    torch.manual_seed(spec.grpo.seed)  # the LoRA initialisation and every draw after it follow the job's seed
    inputs = _Inputs.of(spec, Path(job_file_dir), Path(data_dir))  # model folders, task or environment
    plan = inputs.plan(world)  # the one plan: batch sizes, checkpointing, rollout weights, engines, sharding
    refused = layout_refusals(spec, plan)  # what `auto` resolved to on this device, held to config check's rules
    if refused:
        raise JobSetupError("; ".join(f"{'.'.join(key)}: {why}" for key, why in refused))
    checkpointing, sharded = plan.choices.gradient_checkpointing, plan.choices.sharding == "fsdp"
    # Under FSDP each rank loads only its shard of the base (grpo/fsdp.py).
    student = Student(
        spec.student, inputs.student_dir, world.device, checkpointing, shard_over=world if sharded else None
    )
    engine = make_rollout_engine(spec, student, inputs.student_dir, plan, world.world_size)
    judge = make_judge(spec, student, inputs.judge_dir, Path(job_dir), world, plan) if spec.judge else None
    rewards = job_rewards(spec, Path(job_file_dir), judge)
    work = inputs.task
    if work is None:  # an agent job: trajectory groups from its environment or from agents elsewhere
        work = _agent_job(spec, engine, data_dir, job_dir, stop_requested, plan, inputs.environment)
    trainer = Trainer(spec, job_dir, student, engine, work, rewards, plan, world, judge, hooks)
    release_freed_heap()  # what loading and merging freed: the first step starts from what the models hold
    return trainer


@dataclass(frozen=True)
class _Inputs:
    """What the plan and the models are made from: the model folders, the task or environment, prompt lengths."""

    student_dir: Path
    judge_dir: Path | None
    task: Task | None
    environment: object | None  # an agent job's in-process Environment (None for an external one)
    planned: JobSpec  # the spec the memory plan reads (an environment's own turn limit filled in)
    prompt_tokens: int | None  # the longest training prompt, as measured

    def plan(self, world: RankInfo) -> Plan:
        """What this rank's device holds, planned from the models' configs and the measured prompt lengths."""
        judge_config = load_config(self.judge_dir / "config.json") if self.judge_dir else None
        student_config = load_config(self.student_dir / "config.json")
        return plan_rank(
            self.planned, student_config, judge_config, probe_device(world.device_kind), self.prompt_tokens
        )

    @classmethod
    def of(cls, spec: JobSpec, job_file_dir: Path, data_dir: Path) -> "_Inputs":
        student_dir = resolve_model(spec.student.model, data_dir)
        local_judge = spec.judge and not spec.judge.share_student_base and spec.judge.endpoint is None
        judge_dir = resolve_model(spec.judge.model, data_dir) if local_judge else None
        tokenizer = load_tokenizer(student_dir)
        if spec.task.environment is None:
            task = load_task(spec.task, job_file_dir)
            return cls(student_dir, judge_dir, task, None, spec, longest_prompt_tokens(task, tokenizer))
        environment, planned = _agent_environment(spec, data_dir)
        opening = longest_opening_tokens(environment, tokenizer) if environment is not None else None
        return cls(student_dir, judge_dir, None, environment, planned, opening)


def _agent_job(spec: JobSpec, engine, data_dir: Path, job_dir: Path, stop_requested, plan: Plan, environment):
    from appliance.agents.trajectory_sources import make_source

    bound = plan.sequence_tokens["student"]  # the longest sequence an agent trajectory may reach
    source = make_source(
        spec, engine, Path(data_dir), job_dir=Path(job_dir), stop_requested=stop_requested, max_sequence_tokens=bound
    )
    return AgentJob(source, spec.task.environment, bound, environment)


def _agent_environment(spec: JobSpec, data_dir: Path):
    """(the in-process environment or None for 'external', the spec the memory plan uses).

    The plan counts the environment's own turn limit when the job sets no task.max_turns.
    """
    from appliance.agents.trajectory_sources import build_environment

    if spec.task.environment == EXTERNAL_ENVIRONMENT:
        return None, spec
    environment = build_environment(spec, data_dir)
    turns = getattr(environment, "max_turns", None)
    if spec.task.max_turns is None and isinstance(turns, int) and turns > 0:
        spec = spec.model_copy(update={"task": spec.task.model_copy(update={"max_turns": turns})})
    return environment, spec


def job_rewards(spec: JobSpec, job_file_dir: Path, judge) -> list[WeightedReward]:
    """The job's weighted rewards; `environment` (agent jobs) is the environment's own reward of a trajectory."""
    others = [reward for reward in spec.rewards if reward.name != ENVIRONMENT_REWARD]
    built = {reward.name: reward for reward in build_rewards(others, job_file_dir, judge=judge)}
    rewards = []
    for reward in spec.rewards:
        if reward.name == ENVIRONMENT_REWARD:
            if spec.task.environment is None:
                raise JobSetupError("rewards: 'environment' is an agent environment's reward; set task.environment")
            rewards.append(WeightedReward(reward.name, reward.weight, EnvironmentReward()))
        else:
            rewards.append(built[reward.name])
    return rewards


class AdapterDisabledEngine(HFEngine):
    """The student's base weights with the adapter switched off: a judge that costs no extra weights."""

    def generate(self, prompts, sampling):
        with self.model.disable_adapter():
            return super().generate(prompts, sampling)

    def next_token_logprobs(self, prompts, candidates):
        with self.model.disable_adapter():
            return super().next_token_logprobs(prompts, candidates)


def make_rollout_engine(spec: JobSpec, student: Student, student_dir: Path, plan: Plan, ranks: int = 1):
    """The engine the step samples from: vLLM (inside the ranks of a data-parallel job), a merged copy of the
    student, or the student's own weights."""
    if plan.rollout_engine == "vllm":
        from appliance.engines.vllm_engine import VLLMEngine

        return VLLMEngine.for_student(
            spec,
            student_dir,
            student,
            kv_cache_bytes=plan.choices.rollout_kv_bytes,
            quantize=spec.student.quantization in ("nf4", "fp4"),
            max_model_len=_planned_length(spec, plan, "student"),
            ranks=ranks,
        )
    if plan.choices.rollout_weights == "merged_copy":
        from appliance.engines.merged_copy import MergedCopyEngine

        return MergedCopyEngine(student, student_dir, name=spec.student.model, dtype=DTYPES.get(plan.rollout_dtype))
    return HFEngine(student.model, student.tokenizer, name=spec.student.model)


def _planned_length(spec: JobSpec, plan: Plan, role: str) -> int | None:
    """vLLM's max_model_len: engine.vllm.max_model_len, else the plan's longest sequence of that role."""
    if spec.engine.vllm.max_model_len:
        return spec.engine.vllm.max_model_len
    return plan.sequence_tokens.get(role)


def make_judge(spec: JobSpec, student: Student, judge_dir: Path | None, job_dir: Path, world: RankInfo, plan: Plan):
    """The job's judge on its engine: a remote endpoint, the student's base, vLLM, or transformers."""
    from appliance.judge.judge import Judge

    if spec.judge.endpoint is not None:
        from appliance.engines.openai_remote import OpenAIRemoteEngine

        engine = OpenAIRemoteEngine.from_judge_spec(spec.judge)
    elif spec.judge.share_student_base:
        engine = AdapterDisabledEngine(student.model, student.tokenizer, name=f"{spec.student.model} (base)")
    elif plan.judge_engine == "vllm":
        from appliance.engines.vllm_engine import VLLMEngine

        engine = VLLMEngine.for_judge(
            spec,
            judge_dir,
            devices=world.judge_devices,  # a judge on devices of its own: tensor-parallel over them
            kv_cache_bytes=plan.choices.judge_kv_bytes,
            max_model_len=_planned_length(spec, plan, "judge"),
        )
    else:
        engine = HFEngine.load(judge_dir, spec.judge.quantization, device=world.device, name=spec.judge.model)
    # Group mode shuffles each group with the job's seed, so a rerun sees the same order.
    return Judge(spec.judge, engine, log_path=job_dir / "judge.jsonl", seed=spec.grpo.seed)
