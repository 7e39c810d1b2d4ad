"""The GRPO step loop: rollout, reward, update, sync, record, evaluate, checkpoint — and exact resume.

`Trainer` is built by `job.build_trainer` from a validated JobSpec and driven
by `run.run_job`, one `train_step()` at a time. The loop knows nothing of the
daemon: each step ends in one StepRecord, written to metrics.jsonl and handed
to its `hooks` (grpo/hooks.py), as are phase changes, checkpoints and log lines.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import dataclasses
import json
import resource
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from appliance.budget.host_allocator import release_freed_heap
from appliance.config import best
from appliance.config.schema import JobSpec
from appliance.engines.engine import GenerationEngine, Sampling
from appliance.errors import CheckpointError, CheckpointMismatch, JobStopped
from appliance.grpo.checkpoint import CheckpointInfo, CheckpointManager
from appliance.grpo.hooks import RunHooks
from appliance.grpo.judging import Judging, judging_for
from appliance.grpo.optim import make_optimizer, make_scheduler
from appliance.grpo.phases import PhaseClock
from appliance.grpo.records import RunRecords
from appliance.grpo.rollout import ScoredRollout
from appliance.grpo.sources import AgentSource, PromptSource, RolloutSource, rule_rewards
from appliance.grpo.step_record import MemoryReading, RewardStats, RunEvent, StepRecord
from appliance.grpo.student import Student
from appliance.grpo.time_share import enter_phase
from appliance.grpo.training_state import UpdateSnapshot, load_payload, write_adapter, write_payload
from appliance.grpo.trajectories import AgentJob, ScoredTrajectories
from appliance.grpo.update import GrpoUpdater, UpdateStats
from appliance.rewards.registry import WeightedReward
from appliance.tasks.task import Task

if TYPE_CHECKING:
    from appliance.judge.judge import Judge

SAMPLES_PER_STEP = 8  # completions recorded in samples.jsonl per step (bounded)
# Steps in a row whose update was skipped for a NaN/inf loss or gradient before the job stops.
MAX_NONFINITE_IN_A_ROW = 3


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
    # Idle engines sleep in the phases they do not serve (grpo/time_share.py): only when the plan needs it.
    time_share: bool = False


class Trainer:
    def __init__(
        self,
        spec: JobSpec,
        job_dir: Path,
        student: Student,
        engine: GenerationEngine,
        task: Task | None,
        rewards: list[WeightedReward],
        choices: RuntimeChoices,
        judge: Judge | None = None,
        ledger=None,
        plan=None,
        agent: AgentJob | None = None,
        hooks: RunHooks | None = None,
    ):
        self.spec = spec
        self.job_dir = Path(job_dir)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.student = student
        self.engine = engine
        self.task = task
        self.rewards = rewards
        self.choices = choices
        self.judging: Judging = judging_for(judge)  # the judge's engine, totals and outcomes, or none
        self.ledger = ledger
        self.plan = plan
        self.hooks = hooks or RunHooks()
        self.optimizer = make_optimizer(student.trainable_parameters(), spec.grpo, choices.device)
        self.scheduler = make_scheduler(self.optimizer, spec.grpo)
        self.updater = GrpoUpdater(
            student, self.optimizer, self.scheduler, spec.grpo, spec.engine.vllm.importance_sampling_cap
        )
        self.checkpoints = CheckpointManager(self.job_dir, spec.checkpoint.keep_last)
        self.records = RunRecords(self.job_dir, on_log=lambda line: self.on_event("log", line=line))
        self.source: RolloutSource = (  # an agent job: trajectory groups from agent.source instead of task prompts
            AgentSource(spec, agent, student.tokenizer, rewards, self.records.log)
            if agent is not None
            else PromptSource(spec, task, engine, rewards, self._sampling)
        )
        self.best_metric, self.best_mode = best.resolve(
            spec.checkpoint.best_metric, spec.checkpoint.best_mode, best.evaluation_every(spec) is not None
        )
        self.step = 0
        self.best: dict | None = None  # {"step", "value", "metric"} of best/
        self.micro_batch_size = choices.micro_batch_size
        self.nonfinite_in_a_row = 0
        self.last_record: StepRecord | None = None
        self.eval_part = (0, 1)  # (rank, world size): the part of the held-out set this process evaluates

    def on_event(self, kind: str, **data) -> None:
        self.hooks.on_event(RunEvent(kind=kind, step=self.step, data=data, time=time.time()))

    # ----- resume -------------------------------------------------------------------------------

    def resume(self) -> int | None:
        """Load the newest loadable checkpoint (falling back past damaged ones); its step, or None when none exists."""
        candidates = self.checkpoints.candidates()
        problems = []
        for info in candidates:
            missing = self.checkpoints.missing_files(info)
            try:
                if missing:
                    raise CheckpointError(f"missing {', '.join(missing)}")
                load_payload(info.path, self.student, self.optimizer, self.scheduler)
                self.source.load_state(info.state)
            except CheckpointMismatch as error:  # an older checkpoint of the run holds the same data cursor
                raise CheckpointMismatch(
                    f"cannot resume from {info.path}: {error}; resume with the same task settings and data, "
                    "or --restart to begin the run again"
                ) from None
            except Exception as error:  # noqa: BLE001 - any unreadable file means: use the previous one
                problems.append(f"{info.path.name}: {type(error).__name__}: {error}")
                self.records.log(
                    f"checkpoint {info.path.name} is damaged ({type(error).__name__}: {error}); "
                    "falling back to the previous complete checkpoint"
                )
                continue
            self._restore_state(info)
            return self.step
        if candidates:
            raise CheckpointError(
                f"no checkpoint in {self.checkpoints.root} can be loaded ({'; '.join(problems)}); "
                "--restart begins the run again"
            )
        # An earlier start died before its first checkpoint: its steps run again, so their records go.
        self.records.rewind_to(0)
        return None

    def _restore_state(self, info: CheckpointInfo) -> None:
        self.step = info.step
        self.micro_batch_size = info.state.get("micro_batch_size", self.micro_batch_size)
        self.nonfinite_in_a_row = info.state.get("nonfinite_in_a_row", 0)
        self.best = self._reconciled_best(info)
        self.records.rewind_to(self.step, info.state.get("record"))
        self.engine.update_adapter(info.path / "adapter", self.step)
        self.records.log(f"resumed '{self.spec.name}' at step {self.step} from {info.path}")

    def _reconciled_best(self, info: CheckpointInfo) -> dict | None:
        state = self.checkpoints.reconcile_best(info)
        if state is None or state.get("metric") != self.best_metric:
            return None  # no best yet, or one chosen by another metric: start over with this one
        if state != info.state.get("best"):
            self.records.log(
                f"best/ holds step {state['step']} ({self.best_metric} {state['value']:.4g}); kept as the best so far"
            )
        return state

    # ----- one step -----------------------------------------------------------------------------

    def train_step(self) -> StepRecord:
        clock = PhaseClock(self.ledger, self.on_event, self._enter)
        self.judging.set_step(self.step + 1)
        before = self._token_totals()
        scored = self._rollout(clock)
        release_freed_heap()  # the rollout's freed KV cache and temporaries: the update starts from what is live
        with clock.phase("train"):
            stats = self._update(scored)
        self.step += 1
        with clock.phase("sync"):
            self._sync_engine()
        self.records.samples(scored.sample_records(self.step, self.student.tokenizer, SAMPLES_PER_STEP))
        evaluation = self._evaluate_if_due(clock)
        record = self._record(scored, stats, before, clock, evaluation)
        self._keep_best(record)
        if self.step % self.spec.checkpoint.every == 0 or self.step == self.spec.grpo.steps:
            with clock.phase("checkpoint"):
                self.save_checkpoint(record)
        record = dataclasses.replace(record, seconds=self._seconds(clock, before), time=time.time())
        self.records.metrics(record.to_dict())
        self.last_record = record
        self.hooks.on_step(record)
        self._report_engines()
        self._check_finite(record)
        return record

    def _rollout(self, clock: PhaseClock) -> ScoredRollout | ScoredTrajectories:
        return self.source.rollout(clock, self.step + 1)

    def _sampling(self, step: int) -> Sampling:
        grpo = self.spec.grpo
        return Sampling(
            max_new_tokens=grpo.max_new_tokens,
            n=grpo.group_size,
            temperature=grpo.temperature,
            top_p=grpo.top_p,
            seed=sampling_seed(grpo.seed, step),
        )

    def _update(self, scored: ScoredRollout | ScoredTrajectories) -> UpdateStats:
        """The optimizer step; an out-of-memory error halves the micro-batch and retries (the run goes on).

        A retry never repeats an applied update: with several iterations an error
        after the first optimizer step restores the adapter and optimizer first.
        """
        from appliance.budget.memory_ledger import run_with_oom_backoff

        samples = scored.train_samples(use_engine_logprobs=not self.engine.samples_like_trainer)
        snapshot = UpdateSnapshot(self.student, self.optimizer) if self.spec.grpo.iterations > 1 and samples else None

        def attempt(micro_batch_size: int) -> UpdateStats:
            self.optimizer.zero_grad(set_to_none=True)
            try:
                return self.updater.step(samples, micro_batch_size)
            except torch.OutOfMemoryError:
                if self.updater.applied_steps and snapshot is not None:
                    snapshot.restore()
                    self.records.log(
                        f"step {self.step + 1}: undid {self.updater.applied_steps} applied update(s) before the retry"
                    )
                raise

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
        write_adapter(self.student, folder)
        self.engine.update_adapter(folder, self.step)
        for older in root.iterdir():
            if older != folder:
                shutil.rmtree(older, ignore_errors=True)

    def _check_finite(self, record: StepRecord) -> None:
        if not record.nonfinite:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_in_a_row += 1
        self.records.log(
            f"step {record.step}: non-finite loss or gradient (loss {record.loss}, grad norm "
            f"{record.grad_norm}); the update was skipped ({self.nonfinite_in_a_row} in a row)"
        )
        if self.nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
            raise JobStopped(
                f"{self.nonfinite_in_a_row} steps in a row (up to step {record.step}) had a NaN or inf loss or "
                "gradient, so no update was applied; lower grpo.learning_rate or check the rewards, then resume "
                "from the last checkpoint"
            )

    def _report_engines(self) -> None:
        for engine in self.engines():
            snapshot = engine.metrics_snapshot()
            if snapshot is not None:
                self.on_event("engine_metrics", snapshot=snapshot)

    def _enter(self, planned: str) -> None:
        enter_phase(planned, self.engine, self.judging.engine, self.choices.time_share)

    def engines(self) -> list[GenerationEngine]:
        return [self.engine] + self.judging.engines()

    # ----- evaluation and the best adapter ------------------------------------------------------

    def evaluate_held_out(self, adapter: bool = True, limit: int | None = None):
        """Evaluation on the held-out split (its first `limit` problems), greedy or sampled as
        checkpoint.eval_temperature and checkpoint.eval_samples say: an Evaluation."""
        from appliance.grpo import evaluate

        how = evaluate.EvalSampling.of(self.spec.checkpoint, self.spec.grpo.seed)
        return self.source.evaluate(self.student, self._policy_engine(adapter), adapter, limit, how, self.eval_part)

    def _policy_engine(self, adapter: bool) -> GenerationEngine | None:
        """The rollout engine when it holds exactly the policy to evaluate, else None (evaluate the student).

        A merged copy or vLLM generates several times faster than the 4-bit student on the CPU. It holds the
        adapter of its last sync, which is this step's; before the first update the adapter is zero, so the
        copy is the base model too. A time-shared engine may be asleep, so it is not borrowed.
        """
        if self.choices.time_share or (self.choices.rollout_weights != "merged_copy" and self.engine.kind != "vllm"):
            return None
        if adapter:
            return self.engine if self.step > 0 and self.engine.adapter_version == self.step else None
        return self.engine if self.step == 0 else None

    def _evaluate_if_due(self, clock: PhaseClock):
        every = best.evaluation_every(self.spec)
        if every is None or not self.has_held_out():
            return None
        if self.step % every and self.step != self.spec.grpo.steps:
            return None
        with clock.phase("eval"):
            summary = self.evaluate_held_out(adapter=True, limit=best.evaluation_limit(self.spec)).summary()
        self.on_event("eval", when="step", **summary.to_dict())
        return summary

    def has_held_out(self) -> bool:
        return self.source.has_held_out()

    def _keep_best(self, record: StepRecord) -> None:
        """best/ follows the best metric at every step that measures it (every step, or every evaluation)."""
        value = best.metric_value(record.to_dict(), self.best_metric)
        if value is None or record.nonfinite:
            return
        if not best.improves(value, self.best["value"] if self.best else None, self.best_mode):
            return
        self.best = {"step": self.step, "value": value, "metric": self.best_metric, "mode": self.best_mode}
        path = self.checkpoints.update_best(lambda folder: write_adapter(self.student, folder), self.best)
        self.on_event("checkpoint", path=str(path), best=True)

    def rewards_for_eval(self) -> list[WeightedReward]:
        """Rule rewards only: evaluation does not spend judge calls."""
        return rule_rewards(self.rewards)

    # ----- the record ---------------------------------------------------------------------------

    def _token_totals(self) -> dict:
        student = (self.engine.counters.generated_tokens, self.engine.counters.prompt_tokens)
        return {"student": student, **self.judging.totals()}

    def _seconds(self, clock: PhaseClock, before: dict) -> dict[str, float]:
        """Phase seconds, with the judge's share of the reward phase shown as its own phase."""
        return self.judging.split_seconds(clock.total(), before)

    def memory_reading(self) -> MemoryReading:
        ledger = self.ledger
        return MemoryReading(
            peak_rss_bytes=peak_rss_bytes(),
            planned_peak_bytes=ledger.plan.peak_bytes if ledger is not None else None,
            device_used_bytes=torch.cuda.memory_allocated() if torch.cuda.is_available() else None,
            phase_peak_bytes=dict(ledger.phase_peaks) if ledger is not None else {},
            components_used_bytes=dict(ledger.used) if ledger is not None else {},
        )

    def _record(
        self,
        scored: ScoredRollout | ScoredTrajectories,
        stats: UpdateStats,
        before: dict,
        clock: PhaseClock,
        evaluation,
    ) -> StepRecord:
        lengths = scored.completion_lengths
        informative = scored.advantages.informative
        after = self._token_totals()
        seconds = self._seconds(clock, before)
        roles = {"student": "generate", "judge": "judge"}
        generated = {role: after[role][0] - before[role][0] for role in roles if role in before}
        prompted = {role: after[role][1] - before[role][1] for role in roles if role in before}
        return StepRecord(
            job=self.spec.name,
            step=self.step,
            steps_total=self.spec.grpo.steps,
            time=time.time(),
            reward_mean=_mean(scored.scores.total),
            reward_std=_std(scored.scores.total),
            rewards={name: RewardStats(float(s.mean), float(s.std)) for name, s in scored.scores.stats().items()},
            loss=stats.loss,
            kl=stats.kl,
            clip_ratio=stats.clip_ratio,
            grad_norm=stats.grad_norm,
            learning_rate=float(self.scheduler.get_last_lr()[0]),
            nonfinite=stats.nonfinite,
            groups_informative=int(informative.sum()),
            groups_total=len(scored.groups),
            trained_sequences=stats.sequences,
            trained_tokens=stats.tokens,
            micro_batch_size=self.micro_batch_size,
            completions=len(lengths),
            completion_length_mean=_mean(lengths),
            completion_length_max=max(lengths) if lengths else 0,
            generated_tokens=generated,
            prompt_tokens=prompted,
            tokens_per_second={
                role: tokens / seconds[roles[role]] if seconds.get(roles[role], 0) > 0 else 0.0
                for role, tokens in generated.items()
            },
            seconds=seconds,
            memory=self.memory_reading(),
            eval=evaluation,
            logprob_diff_mean=stats.logprob_diff_mean,
            logprob_diff_max=stats.logprob_diff_max,
            judge_outcomes=self.judging.outcomes(),
            groups_trained=int((scored.trained if isinstance(scored, ScoredRollout) else informative).sum()),
            sampling_rounds=self.source.sampling_rounds,
            prompts_skipped=self.source.prompts_skipped,
        )

    # ----- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self, record: StepRecord) -> Path:
        kept = self.source.checkpoint_state(self.step)
        path = self.checkpoints.save(
            self.step,
            self._write_payload,
            {
                "job": self.spec.name,
                "data_cursor": kept["data_cursor"],
                "metrics": {k: v for k, v in record.to_dict().items() if isinstance(v, (int, float))},
                # The step's metrics line is written after its checkpoint: a crash between the two is mended
                # from this copy on resume (its seconds lack the checkpoint's own).
                "record": json.loads(json.dumps(record.to_dict(), default=float)),
                "best": self.best,
                "micro_batch_size": self.micro_batch_size,
                "nonfinite_in_a_row": self.nonfinite_in_a_row,
                "skipped_prompts": kept["skipped_prompts"],
            },
        )
        self.source.checkpointed(self.step)
        self.on_event("checkpoint", path=str(path), best=False)
        return path

    def _write_payload(self, folder: Path) -> None:
        write_payload(folder, self.student, self.optimizer, self.scheduler)

    def ensure_checkpoint(self) -> None:
        """Make sure the last finished step has a complete checkpoint (before a pause or shutdown)."""
        if self.step == 0 or self.last_record is None:
            return  # nothing trained yet, or the resumed step is the checkpoint itself
        latest = self.checkpoints.latest()
        if latest is None or latest.step != self.step:
            self.save_checkpoint(self.last_record)

    def close(self) -> None:
        """Release the engines (vLLM child processes, the judge's model); the trainer is unusable afterwards."""
        self.source.close()
        self.judging.close()
        for engine in self.engines():
            engine.close()


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0


def _std(values) -> float:
    values = list(values)
    return statistics.stdev(values) if len(values) >= 2 else 0.0
