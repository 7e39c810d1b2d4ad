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

import json
import time
from pathlib import Path
from typing import Callable

from appliance.config.schema import JobSpec
from appliance.errors import StopBeforeStep
from appliance.grpo.step_record import EvalResult, RunEvent, RunResult, StepRecord
from appliance.trackers import open_trackers

StepCallback = Callable[[StepRecord], None]
EventCallback = Callable[[RunEvent], None]
StopCallback = Callable[[], "str | None"]


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

    emit = on_event or (lambda event: None)
    stop_requested = stop_requested or (lambda: None)
    # The trainer polls it too: an agent job waiting for submitted trajectories stops without finishing a step.
    trainer = build_trainer(spec, Path(job_file_dir), Path(data_dir), Path(job_dir), stop_requested=stop_requested)
    try:
        limit = eval_limit if eval_limit is not None else spec.checkpoint.eval_limit
        return _drive(trainer, spec, resume, evaluate, limit, on_step or (lambda record: None), emit, stop_requested)
    finally:
        trainer.close()


def _event(emit: EventCallback, kind: str, step: int, **data) -> None:
    emit(RunEvent(kind=kind, step=step, data=data, time=time.time()))


def _drive(
    trainer,
    spec: JobSpec,
    resume: bool,
    evaluate: bool,
    eval_limit: int | None,
    on_step: StepCallback,
    emit: EventCallback,
    stop_requested: StopCallback,
) -> RunResult:
    log = trainer.records.log

    def log_and_emit(line: str) -> None:
        log(line)
        _event(emit, "log", trainer.step, line=line)

    trainer.records.log = log_and_emit
    trainer.on_event = lambda kind, **data: _event(emit, kind, trainer.step, **data)
    if trainer.plan is not None:
        plan = trainer.plan
        _event(
            emit,
            "memory",
            0,
            planned_bytes=dict(plan.components),
            budget_bytes=plan.budget_bytes,
            planned_peak_bytes=plan.peak_bytes,
            device_total_bytes=plan.device.total_bytes,
            device_used_bytes=plan.device.used_bytes,
        )
    if resume:
        step = trainer.resume()
        if step is None:
            log_and_emit(f"no checkpoint in {trainer.job_dir / 'checkpoints'}; starting at step 0")
    choices = trainer.choices
    log_and_emit(
        f"job '{spec.name}' in {trainer.job_dir}: {spec.grpo.steps} steps, micro-batch "
        f"{trainer.micro_batch_size}, gradient checkpointing {'on' if choices.gradient_checkpointing else 'off'}"
        f", rollouts on {choices.rollout_weights} weights ({trainer.engine.kind})"
    )
    evaluations: dict[str, dict] = {}

    def held_out_eval(adapter: bool, when: str) -> EvalResult:
        started = time.monotonic()
        evaluation = trainer.evaluate_held_out(adapter=adapter, limit=eval_limit)
        evaluations[when] = evaluation.to_dict()
        result = evaluation.summary()
        _event(emit, "eval", trainer.step, when=when, seconds=time.monotonic() - started, **result.to_dict())
        return result

    before = held_out_eval(adapter=False, when="before") if evaluate and trainer.step == 0 else None
    trackers = open_trackers(spec, trainer.job_dir, log_and_emit)

    def step_done(record: StepRecord) -> None:
        on_step(record)
        trackers.write(record)

    trainer.progress = step_done

    def stopped(reason: str) -> RunResult:
        trainer.ensure_checkpoint()
        log_and_emit(f"stopped at step {trainer.step}: {reason}")
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
        trackers.close()
    after = held_out_eval(adapter=True, when="after") if evaluate else None
    if evaluations:
        from appliance.durable import write_atomically

        write_atomically(trainer.job_dir / "eval.json", json.dumps(evaluations, indent=2))
    return RunResult("completed", trainer.step, None, trainer.checkpoints.best_state(), before, after)
