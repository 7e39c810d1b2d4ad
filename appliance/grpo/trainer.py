"""The GRPO step loop: rollout, reward, update, sync, record, checkpoint — and exact resume.

`Trainer.from_job` builds every part from a validated JobSpec; `run()` trains
until `grpo.steps`. The loop knows nothing of the daemon: progress goes to a
callback, records to the job folder.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import dataclasses
import math
import resource
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from appliance.config.schema import JobSpec
from appliance.engines.base import GenerationEngine, Sampling
from appliance.grpo.checkpoint import CheckpointManager, restore_rng_state, rng_state
from appliance.grpo.optim import make_optimizer, make_scheduler
from appliance.grpo.records import RunRecords
from appliance.grpo.rollout import ScoredRollout, rollout
from appliance.grpo.step_record import MemoryReading, RewardStats, StepRecord
from appliance.grpo.student import Student
from appliance.grpo.update import GrpoUpdater, UpdateStats
from appliance.rewards.registry import WeightedReward
from appliance.tasks.base import Task
from appliance.tasks.stream import ProblemStream

SAMPLES_PER_STEP = 8  # completions recorded in samples.jsonl per step (bounded)


def sampling_seed(job_seed: int, step: int) -> int:
    """Each step samples from its own seed, so a resumed run draws the same completions."""
    return (job_seed * 1_000_003 + step) % (2**31 - 1)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class RuntimeChoices:
    """What the budget manager decided for this run (and why, for the log)."""

    device: str
    micro_batch_size: int
    gradient_checkpointing: bool
    rollout_weights: str  # "shared" | "merged_copy"
    reasons: dict


class Trainer:
    def __init__(self, spec: JobSpec, job_dir: Path, student: Student, engine: GenerationEngine, task: Task,
                 rewards: list[WeightedReward], choices: RuntimeChoices, judge=None, ledger=None, progress=None):
        self.spec = spec
        self.job_dir = Path(job_dir)
        self.student = student
        self.engine = engine
        self.task = task
        self.rewards = rewards
        self.choices = choices
        self.judge = judge
        self.ledger = ledger
        self.progress = progress or (lambda record: None)
        self.stream = ProblemStream(task.train, seed=spec.task.seed)
        self.optimizer = make_optimizer(student.trainable_parameters(), spec.grpo, choices.device)
        self.scheduler = make_scheduler(self.optimizer, spec.grpo)
        self.updater = GrpoUpdater(student, self.optimizer, self.scheduler, spec.grpo,
                                   spec.engine.vllm.importance_sampling_cap)
        self.checkpoints = CheckpointManager(self.job_dir, spec.checkpoint.keep_last)
        self.records = RunRecords(self.job_dir)
        self.step = 0
        self.best_value: float | None = None
        self.micro_batch_size = choices.micro_batch_size
        self.last_record: StepRecord | None = None
        self.plan = None
        self.on_event = lambda kind, **data: None  # run_job turns these into RunEvents

    # ----- resume -------------------------------------------------------------------------------

    def resume(self) -> int | None:
        """Load the newest complete checkpoint; returns its step (None when there is none)."""
        latest = self.checkpoints.latest()
        if latest is None:
            return None
        self.student.load_adapter(latest.path / "adapter")
        self.optimizer.load_state_dict(torch.load(latest.path / "optimizer.pt", weights_only=False))
        self.scheduler.load_state_dict(torch.load(latest.path / "scheduler.pt", weights_only=False))
        restore_rng_state(torch.load(latest.path / "rng.pt", weights_only=False))
        self.stream.load_state_dict(latest.state["data_cursor"])
        self.step = latest.step
        self.best_value = latest.state.get("best_value")
        self.micro_batch_size = latest.state.get("micro_batch_size", self.micro_batch_size)
        self.records.rewind_to(self.step)
        self.engine.update_adapter(latest.path / "adapter", self.step)
        self.records.log(f"resumed '{self.spec.name}' at step {self.step} from {latest.path}")
        return self.step

    # ----- one step -----------------------------------------------------------------------------

    def _sampling(self) -> Sampling:
        grpo = self.spec.grpo
        return Sampling(max_new_tokens=grpo.max_new_tokens, n=grpo.group_size, temperature=grpo.temperature,
                        top_p=grpo.top_p, seed=sampling_seed(grpo.seed, self.step + 1))

    def _update(self, scored: ScoredRollout) -> UpdateStats:
        """The optimizer step; an out-of-memory error halves the micro-batch and retries (the run goes on)."""
        from appliance.budget.ledger import run_with_oom_backoff

        samples = scored.train_samples(use_engine_logprobs=self.engine.kind != "hf")

        def attempt(micro_batch_size: int) -> UpdateStats:
            self.optimizer.zero_grad(set_to_none=True)
            return self.updater.step(samples, micro_batch_size)

        stats, used = run_with_oom_backoff(attempt, self.micro_batch_size, ledger=self.ledger)
        if used != self.micro_batch_size:
            self.records.log(f"step {self.step + 1}: out of memory, micro-batch {self.micro_batch_size} -> {used}")
            self.micro_batch_size = used
        return stats

    def _sync_engine(self) -> None:
        """Hand the new adapter to the rollout engine: in memory for transformers, a folder for vLLM."""
        if self.engine.kind != "vllm":
            self.engine.update_adapter(None, self.step)
            return
        root = self.job_dir / "rollout-adapter"
        folder = root / f"v{self.step:06d}"
        self.student.save_adapter(folder)
        self.engine.update_adapter(folder, self.step)
        for older in root.iterdir():
            if older != folder:
                shutil.rmtree(older, ignore_errors=True)

    def train_step(self) -> StepRecord:
        started = time.monotonic()
        if self.judge is not None:
            self.judge.set_step(self.step + 1)
        problems = self.stream.next_batch(self.spec.grpo.prompts_per_step)
        student_before = _counters(self.engine)
        judge_before = self._judge_totals()
        self.engine.wake()
        self._start_phase()
        scored = rollout(self.engine, self.task, problems, self._sampling(), self.rewards, self.spec.grpo.scale_rewards)
        self._end_phase("judge" if self.judge is not None else "generate")
        student_after = _counters(self.engine)
        judge_after = self._judge_totals()
        self.engine.sleep()
        train_started = time.monotonic()
        self._start_phase()
        stats = self._update(scored)
        self._end_phase("train")
        trained = time.monotonic()
        self.step += 1
        self._sync_engine()
        synced = time.monotonic()
        judge_seconds = judge_after["seconds"] - judge_before["seconds"]
        seconds = {"generate": scored.seconds["generate"], "reward": max(0.0, scored.seconds["reward"] - judge_seconds),
                   "train": trained - train_started, "sync": synced - trained}
        if self.judge is not None:
            seconds["judge"] = judge_seconds
        self.records.samples(self._sample_records(scored))
        tokens = {"student": (student_after[0] - student_before[0], student_after[1] - student_before[1])}
        if self.judge is not None:
            tokens["judge"] = (judge_after["generated_tokens"] - judge_before["generated_tokens"],
                               judge_after["prompt_tokens"] - judge_before["prompt_tokens"])
        draft = self._record(scored, stats, tokens, seconds)
        if self.step % self.spec.checkpoint.every == 0 or self.step == self.spec.grpo.steps:
            checkpoint_started = time.monotonic()
            self.save_checkpoint(draft)
            seconds["checkpoint"] = time.monotonic() - checkpoint_started
        seconds["step"] = time.monotonic() - started
        record = dataclasses.replace(draft, seconds=dict(seconds), time=time.time())
        self.records.metrics(record.to_dict())
        self.last_record = record
        self.progress(record)
        for engine in self.engines():
            snapshot = engine.metrics_snapshot()
            if snapshot is not None:
                self.on_event("engine_metrics", snapshot=snapshot)
        return record

    def engines(self) -> list[GenerationEngine]:
        return [self.engine] + ([self.judge.engine] if self.judge is not None else [])

    def _judge_totals(self) -> dict:
        if self.judge is None:
            return {"seconds": 0.0, "generated_tokens": 0, "prompt_tokens": 0}
        stats = self.judge.stats()
        return {key: stats[key] for key in ("seconds", "generated_tokens", "prompt_tokens")}

    def _measures_phases(self) -> bool:
        # Per-phase peaks need an allocator that reports them (CUDA). On the CPU, memory freed by one
        # phase stays in the process (glibc keeps it), so only the whole run's peak RSS is comparable
        # with the plan: it is in every metrics record next to the planned peak.
        return self.ledger is not None and self.ledger.plan.device.kind == "cuda"

    def _start_phase(self) -> None:
        if self._measures_phases():
            from appliance.budget.device import reset_peak

            reset_peak(self.ledger.plan.device.kind)

    def _end_phase(self, phase: str) -> None:
        if self._measures_phases() and phase in self.ledger.plan.phases:
            from appliance.budget.device import peak_bytes

            self.ledger.phase_peak(phase, peak_bytes(self.ledger.plan.device.kind))

    def memory_reading(self) -> MemoryReading:
        ledger = self.ledger
        return MemoryReading(
            peak_rss_bytes=peak_rss_bytes(),
            planned_peak_bytes=ledger.plan.peak_bytes if ledger is not None else None,
            device_used_bytes=torch.cuda.memory_allocated() if torch.cuda.is_available() else None,
            phase_peak_bytes=dict(ledger.phase_peaks) if ledger is not None else {},
            components_used_bytes=dict(ledger.used) if ledger is not None else {},
        )

    def _record(self, scored: ScoredRollout, stats: UpdateStats, tokens: dict[str, tuple[int, int]],
                seconds: dict) -> StepRecord:
        lengths = [len(c.token_ids) for c in scored.flat]
        per_function = {name: RewardStats(float(s.mean), float(s.std)) for name, s in scored.scores.stats().items()}
        phase_of = {"student": "generate", "judge": "judge"}
        return StepRecord(
            job=self.spec.name,
            step=self.step,
            steps_total=self.spec.grpo.steps,
            time=time.time(),
            reward_mean=_mean(scored.scores.total),
            reward_std=_std(scored.scores.total),
            rewards=per_function,
            loss=stats.loss,
            kl=stats.kl,
            clip_ratio=stats.clip_ratio,
            grad_norm=stats.grad_norm,
            learning_rate=float(self.scheduler.get_last_lr()[0]),
            nonfinite=stats.nonfinite,
            groups_informative=int(scored.advantages.informative.sum()),
            groups_total=len(scored.groups),
            trained_sequences=stats.sequences,
            trained_tokens=stats.tokens,
            micro_batch_size=self.micro_batch_size,
            completions=len(lengths),
            completion_length_mean=_mean(lengths),
            completion_length_max=max(lengths) if lengths else 0,
            generated_tokens={role: generated for role, (generated, _) in tokens.items()},
            prompt_tokens={role: prompt for role, (_, prompt) in tokens.items()},
            tokens_per_second={role: generated / seconds[phase_of[role]] if seconds.get(phase_of[role], 0) > 0 else 0.0
                               for role, (generated, _) in tokens.items()},
            seconds=dict(seconds),
            memory=self.memory_reading(),
            eval=None,
            logprob_diff_mean=stats.logprob_diff_mean,
            logprob_diff_max=stats.logprob_diff_max,
            judge_outcomes=dict(self.judge.outcomes) if self.judge is not None else {},
        )

    def _sample_records(self, scored: ScoredRollout) -> list[dict]:
        records = []
        flat = scored.flat
        group_size = self.spec.grpo.group_size
        for index, completion in enumerate(flat[:SAMPLES_PER_STEP]):
            group = index // group_size
            records.append({
                "step": self.step,
                "question": scored.problems[group].question,
                "reference": scored.problems[group].answer,
                "completion": completion.text,
                "reward": scored.scores.total[index],
                "rewards": {name: values[index] for name, values in scored.scores.per_function.items()},
                "advantage": float(scored.advantages.advantages[group, index % group_size]),
            })
        return records

    # ----- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self, record: StepRecord) -> Path:
        metric_name = self.spec.checkpoint.best_metric
        value = _lookup(record.to_dict(), metric_name)
        improved = value is not None and (self.best_value is None or value > self.best_value)
        if improved:
            self.best_value = value

        def payload(folder: Path) -> None:
            self.student.save_adapter(folder / "adapter")
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), folder / "scheduler.pt")
            torch.save(rng_state(), folder / "rng.pt")

        path = self.checkpoints.save(self.step, payload, {
            "job": self.spec.name,
            "data_cursor": self.stream.state_dict(),
            "metrics": {k: v for k, v in record.to_dict().items() if isinstance(v, (int, float))},
            "best_metric": metric_name,
            "best_value": self.best_value,
            "micro_batch_size": self.micro_batch_size,
        })
        if improved:
            self.checkpoints.update_best(path / "adapter", {"step": self.step, metric_name: value})
        self.on_event("checkpoint", path=str(path), best=improved)
        return path

    def ensure_checkpoint(self) -> None:
        """Make sure the last finished step has a complete checkpoint (before a pause or shutdown)."""
        if self.step == 0 or self.last_record is None:
            return  # nothing trained yet, or the resumed step is the checkpoint itself
        latest = self.checkpoints.latest()
        if latest is None or latest.step != self.step:
            self.save_checkpoint(self.last_record)

    def rewards_for_eval(self) -> list[WeightedReward]:
        """Rule rewards only: evaluation does not spend judge calls."""
        return [reward for reward in self.rewards if reward.name != "judge"]

    def close(self) -> None:
        """Release the engines (vLLM child processes, the judge's model); the trainer is unusable afterwards."""
        if self.judge is not None:
            self.judge.close()
        for engine in self.engines():
            engine.close()


def _counters(engine: GenerationEngine) -> tuple[int, int]:
    return engine.counters.generated_tokens, engine.counters.prompt_tokens


def _lookup(record: dict, dotted: str):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0


def _std(values) -> float:
    values = list(values)
    return statistics.stdev(values) if len(values) >= 2 else 0.0
