"""`run_job`: one GRPO job from a validated spec to its last step, the seam the CLI and the daemon's worker share.

The caller owns the job folder (the CLI's `prepare_job_dir`, the daemon's
jobs/<id>/) and hears about progress through two callbacks: `on_step` gets
every finished step's StepRecord, `on_event` phase changes, checkpoints,
evaluations, log lines and memory readings. `stop_requested()` is polled
between steps; when it returns a reason the run makes sure the last finished
step is checkpointed and returns `RunResult(status="stopped")`. Engines are
released in a `finally`, so one process can run several jobs in turn.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import time
from pathlib import Path

from appliance.config.schema import JobSpec
from appliance.errors import StopBeforeStep
from appliance.grpo.hooks import EventCallback, RunHooks, StepCallback, StopCallback
from appliance.grpo.step_record import EvalResult, RunResult, StepRecord
from appliance.trackers import Trackers, open_trackers

__all__ = ["EventCallback", "StepCallback", "StopCallback", "run_job"]


def run_job(
    spec: JobSpec,
    data_dir: Path,
    job_dir: Path,
    *,
    job_file_dir: Path,
    resume: bool = False,
    evaluate: bool = False,
    eval_limit: int | None = None,
    on_step: StepCallback | None = None,
    on_event: EventCallback | None = None,
    stop_requested: StopCallback | None = None,
) -> RunResult:
    """Train `spec` in `job_dir` until `grpo.steps` or until `stop_requested()` gives a reason.

    evaluate: held-out accuracy of the base model before the first step and of
    the trained adapter after the last (the first `eval_limit` problems; None:
    the job's checkpoint.eval_limit), greedy or sampled as the job's
    checkpoint.eval_temperature and checkpoint.eval_samples say.
    """
    from appliance.grpo.job import build_trainer

    stop_requested = stop_requested or (lambda: None)
    steps = _StepSinks(on_step)
    hooks = RunHooks(on_step=steps, on_event=on_event or (lambda event: None))
    # The trainer polls it too: an agent job waiting for submitted trajectories stops without finishing a step.
    trainer = build_trainer(
        spec, Path(job_file_dir), Path(data_dir), Path(job_dir), stop_requested=stop_requested, hooks=hooks
    )
    try:
        limit = eval_limit if eval_limit is not None else spec.checkpoint.eval_limit
        return _drive(trainer, spec, resume, _HeldOut(trainer, limit) if evaluate else None, steps, stop_requested)
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

    def __init__(self, trainer, limit: int | None):
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


def _drive(
    trainer, spec: JobSpec, resume: bool, held_out: _HeldOut | None, steps: _StepSinks, stop_requested: StopCallback
) -> RunResult:
    _announce(trainer, spec, resume)
    before = held_out(adapter=False, when="before") if held_out is not None and trainer.step == 0 else None
    steps.trackers = open_trackers(spec, trainer.job_dir, trainer.records.log)

    def stopped(reason: str) -> RunResult:
        trainer.ensure_checkpoint()
        trainer.records.log(f"stopped at step {trainer.step}: {reason}")
        return RunResult("stopped", trainer.step, reason, trainer.checkpoints.best_state(), before, None)

    try:
        while trainer.step < spec.grpo.steps:
            reason = stop_requested()
            if reason:
                return stopped(reason)
            try:
                trainer.train_step()
            except StopBeforeStep as interrupted:
                return stopped(stop_requested() or str(interrupted))
    finally:
        steps.trackers.close()
    after = held_out(adapter=True, when="after") if held_out is not None else None
    if held_out is not None and held_out.evaluations:
        trainer.records.evaluations(held_out.evaluations)
    return RunResult("completed", trainer.step, None, trainer.checkpoints.best_state(), before, after)


def _announce(trainer, spec: JobSpec, resume: bool) -> None:
    """The plan's memory reading, the resume and the log line that opens the run."""
    if trainer.plan is not None:
        plan = trainer.plan
        trainer.on_event(
            "memory",
            planned_bytes=dict(plan.components),
            budget_bytes=plan.budget_bytes,
            planned_peak_bytes=plan.peak_bytes,
            device_total_bytes=plan.device.total_bytes,
            device_used_bytes=plan.device.used_bytes,
        )
    if resume and trainer.resume() is None:
        trainer.records.log(f"no checkpoint in {trainer.job_dir / 'checkpoints'}; starting at step 0")
    choices = trainer.choices
    trainer.records.log(
        f"job '{spec.name}' in {trainer.job_dir}: {spec.grpo.steps} steps, micro-batch "
        f"{trainer.micro_batch_size}, gradient checkpointing {'on' if choices.gradient_checkpointing else 'off'}"
        f", rollouts on {choices.rollout_weights} weights ({trainer.engine.kind})"
    )
