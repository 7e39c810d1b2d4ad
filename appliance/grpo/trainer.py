"""The GRPO step loop: rollout, score, update, sync, record, evaluate, checkpoint, and exact resume.

`Trainer` is built by `run.build_trainer` and driven by `run.run_job`, one
`train_step()` at a time; read `train_step` top to bottom to follow a step.
The loop knows nothing of the daemon: each step ends in one StepRecord,
written to metrics.jsonl and handed to its hooks, as are phase changes,
checkpoints and log lines. In a data-parallel job every rank runs this same
loop on its share of the step; `world.is_main` alone writes records,
checkpoints and best/. It never reads the job file again: everything it
decides at run time comes from the plan's choices.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import dataclasses
import json
import resource
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from appliance.budget.host_allocator import release_freed_heap
from appliance.budget.memory_ledger import Ledger
from appliance.budget.plan import Plan
from appliance.config import best
from appliance.config.schema import JobSpec
from appliance.engines.engine import GenerationEngine
from appliance.errors import CheckpointError, CheckpointMismatch, JobStopped
from appliance.grpo.checkpoint import (
    CheckpointInfo,
    CheckpointManager,
    check_world_size,
    load_payload,
    load_tensors,
    restore_rng_state,
    rng_file,
    rng_state,
    write_adapter,
    write_payload,
)
from appliance.grpo.distributed import GradientReducer, RankInfo
from appliance.grpo.fsdp import generates_with, layer_elements_held, remerges_from, whole_weights
from appliance.grpo.records import RunRecords, StepFigures, judging_for
from appliance.grpo.rollout import PromptSource, SamplingRounds, ScoredRollout
from appliance.grpo.step_record import (
    PLANNED_PHASES,
    MemoryReading,
    PhaseClock,
    RewardStats,
    RunEvent,
    RunHooks,
    StepRecord,
)
from appliance.grpo.student import Student
from appliance.grpo.trajectories import AgentJob, AgentSource, OneRound, ScoredTrajectories
from appliance.grpo.update import (
    GrpoUpdater,
    UpdateSnapshot,
    UpdateStats,
    halved_micro_batch,
    make_optimizer,
    make_scheduler,
)
from appliance.rewards.registry import WeightedReward
from appliance.tasks.task import Task

if TYPE_CHECKING:
    from appliance.judge.judge import Judge

SAMPLES_PER_STEP = 8  # completions recorded in samples.jsonl per step (bounded)
# Steps in a row whose update was skipped for a NaN/inf loss or gradient before the job stops.
MAX_NONFINITE_IN_A_ROW = 3


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RolloutSource(Protocol):
    """Where a step's scored groups come from: a task's prompts (rollout.py) or an agent's trajectories."""

    prompts_skipped: int  # prompts the data order passed over this step (skip_settled_after)

    def rounds(self) -> SamplingRounds | OneRound: ...

    def generate(self, step: int, round_index: int): ...

    def score(self, generated, step: int) -> ScoredRollout | ScoredTrajectories: ...

    def has_held_out(self) -> bool: ...

    def evaluate(self, student, engine: GenerationEngine | None, adapter: bool, limit: int | None, how): ...

    def checkpoint_state(self, step: int) -> dict: ...

    def load_state(self, state: dict) -> None: ...

    def checkpointed(self, step: int) -> None: ...

    def close(self) -> None: ...


class Trainer:
    def __init__(
        self,
        spec: JobSpec,
        job_dir: Path,
        student: Student,
        engine: GenerationEngine,
        work: Task | AgentJob,
        rewards: list[WeightedReward],
        plan: Plan,
        world: RankInfo,
        judge: Judge | None = None,
        hooks: RunHooks | None = None,
    ):
        self.spec, self.job_dir, self.world, self.plan = spec, Path(job_dir), world, plan
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.student, self.engine = student, engine
        self.choices = plan.choices
        self.judging = judging_for(judge)  # the judge's engine, totals and outcomes, or none
        self.ledger = Ledger(plan)
        self.ledger.measure_loaded(student.model, getattr(engine, "model", None))  # what the models really hold
        self.hooks = hooks or RunHooks()
        self.optimizer = make_optimizer(student.trainable_parameters(), spec.grpo, world.device)
        self.scheduler = make_scheduler(self.optimizer, spec.grpo)
        self.updater = GrpoUpdater(
            student, self.optimizer, self.scheduler, spec.grpo, spec.engine.vllm.importance_sampling_cap
        )
        self.checkpoints = CheckpointManager(self.job_dir, spec.checkpoint.keep_last)
        self.records = RunRecords(self.job_dir, on_log=lambda line: self.on_event("log", line=line))
        self.source: RolloutSource = (  # an agent job: trajectory groups from its source instead of task prompts
            AgentSource(spec, work, student.tokenizer, rewards, self.log)
            if isinstance(work, AgentJob)
            else PromptSource(spec, work, engine, rewards, world)
        )
        self.best_metric, self.best_mode = best.resolve(
            spec.checkpoint.best_metric, spec.checkpoint.best_mode, best.evaluation_every(spec) is not None
        )
        self.step = 0
        self.best: dict | None = None  # {"step", "value", "metric"} of best/
        self.micro_batch_size = self.choices.micro_batch_size
        self.nonfinite_in_a_row = 0
        self.last_record: StepRecord | None = None
        if world.world_size > 1:
            self._join_world()

    def _join_world(self) -> None:
        """One rank of several (build_trainer checked the count): sum gradients over the ranks, start from rank 0's
        adapter, keep the judge's log apart."""
        world = self.world
        sharded = self.choices.sharding == "fsdp"
        self.updater.reducer = GradientReducer(lockstep=sharded)  # every forward of a sharded base is a collective
        GradientReducer.broadcast_parameters(self.student.trainable_parameters())
        if not world.is_main:
            self.judging.log_to(self.job_dir / f"judge.rank{world.rank}.jsonl")  # judge.jsonl is rank 0's
        if sharded:  # Student loaded this rank's shard of the base (grpo/fsdp.py)
            held, whole = layer_elements_held(self.student.model)
            self.log(
                f"the student's base is sharded over {world.world_size} ranks with FSDP: each holds {held:,} of the "
                f"decoder layers' {whole:,} weights (embeddings and head whole); generation gathers them whole"
            )

    def on_event(self, kind: str, **data) -> None:
        self.hooks.on_event(RunEvent(kind=kind, step=self.step, data=data, time=time.time()))

    def log(self, line: str) -> None:
        """A line in log.txt (and a "log" event); rank 0 speaks for a data-parallel job."""
        if self.world.is_main:
            self.records.log(line)

    # ----- one step -----------------------------------------------------------------------------

    def train_step(self) -> StepRecord:
        """One GRPO step, in the order it runs."""
        step = self.step + 1
        clock = PhaseClock(self.ledger, self.on_event, self._enter)
        self.judging.set_step(step)
        before = self._token_totals()
        rounds = self.source.rounds()  # dynamic sampling: more rounds until enough groups carry signal
        with self._whole_base(self._generates_through_student()):
            while rounds.wants_more():
                with clock.phase("generate"):
                    generated = self.source.generate(step, len(rounds.rounds))  # prompts x group_size completions
                with clock.phase("reward"):
                    rounds.add(self.source.score(generated, step))  # rewards -> weighted sum -> group advantages
        scored = rounds.rollout()
        release_freed_heap()  # the rollout's freed KV cache and temporaries: the update starts from what is live
        with clock.phase("train"):
            stats = self._update(scored)  # micro-batches, loss, backward, optimizer step; OOM halves and retries
        self.step = step
        with clock.phase("sync"):
            self._sync_engine()  # the new adapter to the rollout engine
        self._keep_samples(scored)
        evaluation = self._evaluate_if_due(clock)
        figures = StepFigures.of(scored, self.world)  # a data-parallel job's: summed over its ranks from numbers
        record = self._record(figures, stats, before, clock, evaluation, len(rounds.rounds))
        self._keep_best(record)
        if self.step % self.spec.checkpoint.every == 0 or self.step == self.spec.grpo.steps:
            with clock.phase("checkpoint"):
                self.save_checkpoint(record)
        record = dataclasses.replace(
            record, seconds=self.judging.split_seconds(clock.total(), before), time=time.time()
        )
        if self.world.is_main:
            self.records.metrics(record.to_dict())
        self.last_record = record
        self.hooks.on_step(record)
        self._report_engines()
        self._check_finite(record)
        return record

    def _update(self, scored: ScoredRollout | ScoredTrajectories) -> UpdateStats:
        """The optimizer step; an out-of-memory error halves the micro-batch and retries (the run goes on).

        A retry never repeats an applied update: with several iterations an error
        after the first optimizer step restores the adapter and optimizer first.
        """
        samples = scored.train_samples(use_engine_logprobs=not self.engine.samples_like_trainer)
        snapshot = UpdateSnapshot(self.student, self.optimizer) if self.spec.grpo.iterations > 1 and samples else None
        size = self.micro_batch_size
        while True:
            self.optimizer.zero_grad(set_to_none=True)
            try:
                stats = self.updater.step(samples, size)
                break
            except torch.OutOfMemoryError as error:
                if self.updater.applied_steps and snapshot is not None:
                    snapshot.restore()
                    self.log(
                        f"step {self.step + 1}: undid {self.updater.applied_steps} applied update(s) before the retry"
                    )
                size = halved_micro_batch(size, error, self.ledger)  # raises at micro-batch 1
        if size != self.micro_batch_size:  # later steps keep the size that fitted
            self.log(f"step {self.step + 1}: out of memory, micro-batch {self.micro_batch_size} -> {size}")
            self.micro_batch_size = size
        if self.updater.reducer is not None:  # the step's figures count every rank's samples
            sequences, tokens = self.updater.reducer.counts(stats.sequences, stats.tokens)
            stats = dataclasses.replace(stats, sequences=sequences, tokens=tokens)
        return stats

    def _sync_engine(self) -> None:
        """Hand the new adapter to the rollout engine: in memory for transformers, a folder for vLLM."""
        if self.engine.kind != "vllm":
            with self._whole_base(remerges_from(self.engine, self.student.model)):
                self.engine.update_adapter(None, self.step)
            return
        root = self.job_dir / "rollout-adapter"
        folder = root / f"v{self.step:06d}"
        if self.world.is_main:  # every rank's adapter is the same (the gradients were summed): one writes it
            write_adapter(self.student, folder)
        self.world.barrier()
        self.engine.update_adapter(folder, self.step)  # each rank's engine (or its share of a copy) loads it
        self.world.barrier()  # no rank removes a folder another is still reading
        if self.world.is_main:
            for older in root.iterdir():
                if older != folder:
                    shutil.rmtree(older, ignore_errors=True)

    def _keep_samples(self, scored: ScoredRollout | ScoredTrajectories) -> None:
        """samples.jsonl: the step's first completions, in rank order (each rank offers at most the bound's worth)."""
        offered = scored.sample_records(self.step, self.student.tokenizer, SAMPLES_PER_STEP)
        if self.world.world_size > 1:
            offered = [record for part in self.world.gather(offered) for record in part]
        if self.world.is_main:
            self.records.samples(offered[:SAMPLES_PER_STEP])

    def _whole_base(self, needed: bool):
        """A base sharded with FSDP gathered whole while ranks generate through it (they stop at different tokens)."""
        return whole_weights(self.student.model) if needed and self.choices.sharding == "fsdp" else nullcontext()

    def _generates_through_student(self) -> bool:
        model = self.student.model
        return generates_with(self.engine, model) or generates_with(self.judging.engine, model)

    def _check_finite(self, record: StepRecord) -> None:
        if not record.nonfinite:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_in_a_row += 1
        self.log(
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
        checkpoint.eval_temperature and checkpoint.eval_samples say: an Evaluation.

        In a data-parallel job each rank evaluates its part of the problems and every rank gets the merge.
        """
        from appliance.grpo import evaluate

        how = evaluate.EvalSampling.of(self.spec.checkpoint, self.spec.grpo.seed)
        engine = self._policy_engine(adapter)  # None: the student's own weights
        with self._whole_base(engine is None or generates_with(engine, self.student.model)):
            local = self.source.evaluate(self.student, engine, adapter, limit, how)
        return local if self.world.world_size == 1 else evaluate.merge_evaluations(self.world.gather(local))

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
        path = self.job_dir / "best"
        if self.world.is_main:
            path = self.checkpoints.update_best(lambda folder: write_adapter(self.student, folder), self.best)
        self.on_event("checkpoint", path=str(path), best=True)

    # ----- the record ---------------------------------------------------------------------------

    def _token_totals(self) -> dict:
        """The engines' counters so far; a data-parallel job's are summed over its ranks."""
        totals = {
            "student": (self.engine.counters.generated_tokens, self.engine.counters.prompt_tokens),
            **self.judging.totals(),
        }
        if self.world.world_size == 1:
            return totals
        flat = [
            value for key in totals for value in (totals[key] if isinstance(totals[key], tuple) else (totals[key],))
        ]
        summed, out = iter(self.world.sum(flat)), {}
        for key, value in totals.items():  # every rank's engines count the same keys in the same order
            out[key] = tuple(int(next(summed)) for _ in value) if isinstance(value, tuple) else next(summed)
        return out

    def _judge_outcomes(self) -> dict[str, int]:
        """The judge's outcome counts so far; a data-parallel job's summed over its ranks (each judges its share)."""
        outcomes = self.judging.outcomes()
        if self.world.world_size == 1:
            return outcomes
        return dict(zip(outcomes, (int(value) for value in self.world.sum(list(outcomes.values())))))

    def memory_reading(self) -> MemoryReading:
        ledger = self.ledger
        return MemoryReading(
            peak_rss_bytes=peak_rss_bytes(),
            planned_peak_bytes=ledger.plan.peak_bytes,
            device_used_bytes=torch.cuda.memory_allocated() if torch.cuda.is_available() else None,
            phase_peak_bytes=dict(ledger.phase_peaks),
            components_used_bytes=dict(ledger.used),
        )

    def _record(
        self, figures: StepFigures, stats: UpdateStats, before: dict, clock: PhaseClock, evaluation, rounds: int
    ) -> StepRecord:
        after, seconds = self._token_totals(), self.judging.split_seconds(clock.total(), before)
        roles = {"student": "generate", "judge": "judge"}
        generated = {role: after[role][0] - before[role][0] for role in roles if role in before}
        return StepRecord(
            job=self.spec.name,
            step=self.step,
            steps_total=self.spec.grpo.steps,
            time=time.time(),
            reward_mean=figures.reward_mean,
            reward_std=figures.reward_std,
            rewards={name: RewardStats(float(mean), float(std)) for name, (mean, std) in figures.rewards.items()},
            loss=stats.loss,
            kl=stats.kl,
            clip_ratio=stats.clip_ratio,
            grad_norm=stats.grad_norm,
            learning_rate=float(self.scheduler.get_last_lr()[0]),
            nonfinite=stats.nonfinite,
            groups_informative=figures.groups_informative,
            groups_total=figures.groups_total,
            trained_sequences=stats.sequences,
            trained_tokens=stats.tokens,
            micro_batch_size=self.micro_batch_size,
            completions=figures.completions,
            completion_length_mean=figures.completion_length_mean,
            completion_length_max=figures.completion_length_max,
            generated_tokens=generated,
            prompt_tokens={role: after[role][1] - before[role][1] for role in roles if role in before},
            tokens_per_second={
                role: tokens / seconds[roles[role]] if seconds.get(roles[role], 0) > 0 else 0.0
                for role, tokens in generated.items()
            },
            seconds=seconds,
            memory=self.memory_reading(),
            eval=evaluation,
            logprob_diff_mean=stats.logprob_diff_mean,
            logprob_diff_max=stats.logprob_diff_max,
            judge_outcomes=self._judge_outcomes(),
            groups_trained=figures.groups_trained,
            sampling_rounds=rounds,
            prompts_skipped=self.source.prompts_skipped,
        )

    # ----- checkpoints and resume ---------------------------------------------------------------

    def save_checkpoint(self, record: StepRecord) -> Path:
        """The step's checkpoint, written by rank 0 once every rank finished the step; every rank's RNG in it."""
        kept = self.source.checkpoint_state(self.step)
        rng_states = self.world.gather(rng_state())
        self.world.barrier()  # every rank finished the step before rank 0 writes it
        path = self.checkpoints.root / f"step-{self.step:06d}"
        if self.world.is_main:
            path = self.checkpoints.save(
                self.step,
                lambda folder: self._write_payload(folder, rng_states),
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
        self.world.barrier()  # nobody runs ahead of a checkpoint still being written
        self.source.checkpointed(self.step)
        self.on_event("checkpoint", path=str(path), best=False)
        return path

    def _write_payload(self, folder: Path, rng_states: list[dict]) -> None:
        write_payload(folder, self.student, self.optimizer, self.scheduler)
        if self.world.world_size > 1:  # each rank resumes its own draws
            for index, state in enumerate(rng_states):
                torch.save(state, folder / rng_file(index))
            (folder / "world.json").write_text(json.dumps({"world_size": self.world.world_size}))

    def ensure_checkpoint(self) -> None:
        """Make sure the last finished step has a complete checkpoint (before a pause or shutdown)."""
        if self.step == 0 or self.last_record is None:
            return  # nothing trained yet, or the resumed step is the checkpoint itself
        latest = self.checkpoints.latest()
        if latest is None or latest.step != self.step:
            self.save_checkpoint(self.last_record)

    def resume(self) -> int | None:
        """Load the newest loadable checkpoint (falling back past damaged ones); its step, or None when none exists."""
        check_world_size(self.job_dir, self.world.world_size)
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
                self.log(
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
        if self.world.is_main:  # an earlier start died before its first checkpoint: its steps run again
            self.records.rewind_to(0)
        return None

    def _restore_state(self, info: CheckpointInfo) -> None:
        self.step = info.step
        self.micro_batch_size = info.state.get("micro_batch_size", self.micro_batch_size)
        self.nonfinite_in_a_row = info.state.get("nonfinite_in_a_row", 0)
        self.best = self._reconciled_best(info)
        if self.world.is_main:
            self.records.rewind_to(self.step, info.state.get("record"))
        self.engine.update_adapter(info.path / "adapter", self.step)
        if self.world.world_size > 1:
            restore_rng_state(load_tensors(info.path / rng_file(self.world.rank)))
        self.log(f"resumed '{self.spec.name}' at step {self.step} from {info.path}")

    def _reconciled_best(self, info: CheckpointInfo) -> dict | None:
        state = self.checkpoints.reconcile_best(info, repair=self.world.is_main)
        if state is None or state.get("metric") != self.best_metric:
            return None  # no best yet, or one chosen by another metric: start over with this one
        if state != info.state.get("best"):
            self.log(
                f"best/ holds step {state['step']} ({self.best_metric} {state['value']:.4g}); kept as the best so far"
            )
        return state

    def close(self) -> None:
        """Release the engines (vLLM child processes, the judge's model); the trainer is unusable afterwards."""
        self.source.close()
        self.judging.close()
        for engine in self.engines():
            engine.close()


def enter_phase(phase: str, rollout: GenerationEngine, judge: GenerationEngine | None, time_share: bool) -> None:
    """Put the engines in the state the plan assumed for `phase` (a planned phase: generate, judge, train).

    Only when the plan chose time_share: then it counted an engine's weights and cache out of the phases it does
    not serve, so before each phase the engines of the other phases sleep (vLLM sleep level 1 on CUDA; a
    transformers engine that owns its weights moves them to host RAM) and the phase's own engine wakes. Without
    it every engine stays awake: the plan counted them all in every phase, and waking costs seconds per step.
    """
    if phase not in PLANNED_PHASES:
        raise ValueError(f"phase {phase!r} is not one of {PLANNED_PHASES}")
    if not time_share:
        return
    awake = {"generate": rollout, "judge": judge, "train": None}[phase]
    for engine in (rollout, judge):
        if engine is not None and engine is not awake:
            engine.sleep()
    if awake is not None:
        awake.wake()
