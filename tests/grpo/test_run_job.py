"""run_job end to end on the tiny model: stop and resume, damaged checkpoints, iterations > 1 with beta > 0,
held-out evaluation driving best/, an out-of-memory retry that must not repeat an update, non-finite steps."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from tiny_model import tiny_job

from appliance.job_checks import load_checked_job
from appliance.errors import JobStopped
from appliance.grpo.distributed import one_process
from appliance.grpo.run import build_trainer
from appliance.grpo.rollout import rule_rewards
from appliance.grpo.run import run_job
from appliance.grpo.step_record import StepRecord

pytestmark = pytest.mark.model


def _spec(tiny_model_dir, tmp_path, data_dir, **sections):
    return load_checked_job(tiny_job(tiny_model_dir, tmp_path, **sections), data_dir)


def _metrics(job_dir) -> list[StepRecord]:
    return [StepRecord.from_dict(json.loads(line)) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_stop_request_checkpoints_the_last_step_and_resume_finishes_the_run(tiny_model_dir, tmp_path, fresh_data_dir):
    spec = _spec(tiny_model_dir, tmp_path, fresh_data_dir, checkpoint={"every": 10})
    job_dir = fresh_data_dir / "jobs" / "tiny"
    steps, events = [], []
    result = run_job(
        spec,
        fresh_data_dir,
        job_dir,
        job_file_dir=tmp_path,
        on_step=steps.append,
        on_event=events.append,
        stop_requested=lambda: "pause" if steps else None,
    )
    assert (result.status, result.step, result.stop_reason) == ("stopped", 1, "pause")
    assert (job_dir / "checkpoints" / "step-000001" / "state.json").is_file()  # not a checkpoint step: written on stop
    kinds = {event.kind for event in events}
    assert {"phase", "checkpoint", "log", "memory"} <= kinds
    assert [e.data["phase"] for e in events if e.kind == "phase" and e.data["state"] == "start"][:4] == [
        "generate",
        "reward",
        "train",
        "sync",
    ]

    resumed = run_job(spec, fresh_data_dir, job_dir, job_file_dir=tmp_path, resume=True, on_step=steps.append)
    assert (resumed.status, resumed.step) == ("completed", 3)
    records = _metrics(job_dir)
    assert [r.step for r in records] == [1, 2, 3]
    assert records[-1].seconds["checkpoint"] > 0 and records[-1].seconds["step"] >= records[-1].seconds["train"]
    assert (job_dir / "best").is_symlink() and json.loads((job_dir / "best" / "best.json").read_text())[
        "metric"
    ] == "reward_mean"
    assert resumed.best == json.loads((job_dir / "best" / "best.json").read_text())


def test_resume_falls_back_past_a_damaged_newest_checkpoint(tiny_model_dir, tmp_path, fresh_data_dir):
    spec = _spec(tiny_model_dir, tmp_path, fresh_data_dir, grpo={"steps": 2}, checkpoint={"every": 1, "keep_last": 3})
    job_dir = fresh_data_dir / "jobs" / "tiny"
    run_job(spec, fresh_data_dir, job_dir, job_file_dir=tmp_path)
    (job_dir / "checkpoints" / "step-000002" / "optimizer.pt").write_bytes(b"torn")
    longer = _spec(tiny_model_dir, tmp_path, fresh_data_dir, grpo={"steps": 3}, checkpoint={"every": 1, "keep_last": 3})
    result = run_job(longer, fresh_data_dir, job_dir, job_file_dir=tmp_path, resume=True)
    log = (job_dir / "log.txt").read_text()
    assert "checkpoint step-000002 is damaged" in log and "resumed 'tiny' at step 1" in log
    assert result.step == 3 and [r.step for r in _metrics(job_dir)] == [1, 2, 3]


def test_a_crash_between_checkpoint_and_metrics_line_loses_no_record(tiny_model_dir, tmp_path, fresh_data_dir):
    """The metrics line of a step is written after its checkpoint; kill -9 between the two leaves exactly this."""
    spec = _spec(tiny_model_dir, tmp_path, fresh_data_dir, grpo={"steps": 2}, checkpoint={"every": 1, "keep_last": 3})
    job_dir = fresh_data_dir / "jobs" / "tiny"
    run_job(spec, fresh_data_dir, job_dir, job_file_dir=tmp_path)
    whole = (job_dir / "metrics.jsonl").read_text().splitlines()
    (job_dir / "metrics.jsonl").write_text(whole[0] + "\n")  # step 2 checkpointed, its line never written
    longer = _spec(tiny_model_dir, tmp_path, fresh_data_dir, grpo={"steps": 3}, checkpoint={"every": 1, "keep_last": 3})
    result = run_job(longer, fresh_data_dir, job_dir, job_file_dir=tmp_path, resume=True)
    records = _metrics(job_dir)
    assert result.step == 3 and [r.step for r in records] == [1, 2, 3]  # step 2 written back once, not run again
    mended = json.loads((job_dir / "metrics.jsonl").read_text().splitlines()[1])
    original = json.loads(whole[1])
    assert {k: mended[k] for k in ("reward_mean", "loss", "completions")} == {
        k: original[k] for k in ("reward_mean", "loss", "completions")
    }


def test_iterations_and_kl_with_held_out_evaluation_choosing_best(tiny_model_dir, tmp_path, fresh_data_dir):
    spec = _spec(
        tiny_model_dir,
        tmp_path,
        fresh_data_dir,
        grpo={"steps": 2, "iterations": 2, "beta": 0.1},
        checkpoint={"every": 2, "eval_every": 1, "eval_limit": 4},
    )
    job_dir = fresh_data_dir / "jobs" / "tiny"
    run_job(spec, fresh_data_dir, job_dir, job_file_dir=tmp_path)
    first, second = _metrics(job_dir)
    assert first.trained_sequences > 0 and second.trained_sequences > 0
    assert second.kl > 0 and all(math.isfinite(r.loss) for r in (first, second))
    assert first.eval.problems == 4 and second.eval is not None and second.seconds["eval"] > 0
    best = json.loads((job_dir / "best" / "best.json").read_text())
    assert best["metric"] == "eval.accuracy" and best["step"] in (1, 2)


def test_sampled_held_out_evaluation_is_recorded_with_its_temperature_and_samples(
    tiny_model_dir, tmp_path, fresh_data_dir
):
    """checkpoint.eval_temperature / eval_samples reach every evaluation: before, during (eval_every), after;
    --eval without a limit evaluates checkpoint.eval_limit problems."""
    spec = _spec(
        tiny_model_dir,
        tmp_path,
        fresh_data_dir,
        grpo={"steps": 1},
        checkpoint={"every": 1, "eval_every": 1, "eval_limit": 2, "eval_temperature": 1.0, "eval_samples": 3},
    )
    job_dir = fresh_data_dir / "jobs" / "tiny"
    events = []
    result = run_job(spec, fresh_data_dir, job_dir, job_file_dir=tmp_path, evaluate=True, on_event=events.append)
    summary = json.loads((job_dir / "eval.json").read_text())
    for when in ("before", "after"):
        assert {key: summary[when][key] for key in ("problems", "samples", "draws", "temperature")} == {
            "problems": 2,
            "samples": 3,
            "draws": 6,
            "temperature": 1.0,
        }
    assert (result.eval_before.samples, result.eval_after.temperature) == (3, 1.0)
    (record,) = _metrics(job_dir)
    assert (record.eval.problems, record.eval.samples, record.eval.temperature) == (2, 3, 1.0)
    evals = [e.data for e in events if e.kind == "eval"]
    assert [e["when"] for e in evals] == ["before", "step", "after"] and all(e["samples"] == 3 for e in evals)


def _adapter(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.student.trainable_parameters()]


def test_an_out_of_memory_error_after_the_first_update_does_not_apply_it_twice(
    tiny_model_dir, tmp_path, fresh_data_dir, monkeypatch
):
    spec = _spec(tiny_model_dir, tmp_path, fresh_data_dir, grpo={"steps": 1, "iterations": 2, "micro_batch_size": 8})
    clean = build_trainer(spec, tmp_path, fresh_data_dir, fresh_data_dir / "jobs" / "clean", one_process())
    clean.train_step()
    expected = _adapter(clean)
    clean.close()

    # The allocator fails once, inside the second iteration's backward (after one optimizer step was applied).
    backward, calls = torch.Tensor.backward, [0]

    def failing_backward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected at the allocator boundary)")
        return backward(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", failing_backward)
    retried = build_trainer(spec, tmp_path, fresh_data_dir, fresh_data_dir / "jobs" / "retried", one_process())
    record = retried.train_step()
    assert record.micro_batch_size == 4 and [(h.from_size, h.to_size) for h in retried.ledger.halvings] == [(8, 4)]
    log = (retried.job_dir / "log.txt").read_text()
    assert "undid 1 applied update(s)" in log and "out of memory, micro-batch 8 -> 4" in log
    for got, want in zip(_adapter(retried), expected):
        assert torch.allclose(got, want, atol=1e-5)
    retried.close()


def test_an_error_other_than_out_of_memory_is_not_retried(tiny_model_dir, tmp_path, fresh_data_dir, monkeypatch):
    spec = _spec(tiny_model_dir, tmp_path, fresh_data_dir, grpo={"steps": 1, "micro_batch_size": 8})
    calls = [0]

    def failing_backward(self, *args, **kwargs):
        calls[0] += 1
        raise RuntimeError("a kernel failed (injected)")

    monkeypatch.setattr(torch.Tensor, "backward", failing_backward)
    trainer = build_trainer(spec, tmp_path, fresh_data_dir, fresh_data_dir / "jobs" / "tiny", one_process())
    try:
        with pytest.raises(RuntimeError, match="injected"):
            trainer.train_step()
        assert calls == [1] and trainer.ledger.halvings == [] and trainer.micro_batch_size == 8
    finally:
        trainer.close()


def test_steps_without_finite_gradients_are_skipped_and_stop_the_job(
    tiny_model_dir, tmp_path, fresh_data_dir, monkeypatch
):
    spec = _spec(tiny_model_dir, tmp_path, fresh_data_dir, grpo={"steps": 6}, checkpoint={"every": 1, "keep_last": 6})
    trainer = build_trainer(spec, tmp_path, fresh_data_dir, fresh_data_dir / "jobs" / "tiny", one_process())
    trainer.train_step()  # one healthy step
    healthy = _adapter(trainer)
    backward = torch.Tensor.backward

    def overflowing_backward(self, *args, **kwargs):  # what an fp16 overflow on the device produces
        backward(self, *args, **kwargs)
        for parameter in trainer.student.trainable_parameters():
            if parameter.grad is not None:
                parameter.grad.fill_(math.inf)

    monkeypatch.setattr(torch.Tensor, "backward", overflowing_backward)
    trainer.train_step()
    trainer.train_step()
    with pytest.raises(JobStopped, match="3 steps in a row"):
        trainer.train_step()
    records = _metrics(trainer.job_dir)
    assert [r.nonfinite for r in records] == [False, True, True, True]
    assert all(torch.equal(a, b) for a, b in zip(_adapter(trainer), healthy))  # no update was applied
    assert "update was skipped (2 in a row)" in (trainer.job_dir / "log.txt").read_text()
    for adapter in (trainer.job_dir / "checkpoints").glob("step-*/adapter/adapter_model.safetensors"):
        assert all(bool(torch.isfinite(t).all()) for t in load_file(adapter).values())
    trainer.close()


def test_a_resume_without_any_checkpoint_runs_from_step_one_and_records_each_step_once(
    tiny_model_dir, tmp_path, fresh_data_dir
):
    import shutil

    spec = _spec(tiny_model_dir, tmp_path, fresh_data_dir, checkpoint={"every": 10})
    job_dir = fresh_data_dir / "jobs" / "tiny"
    steps = []
    run_job(
        spec,
        fresh_data_dir,
        job_dir,
        job_file_dir=tmp_path,
        on_step=steps.append,
        stop_requested=lambda: "pause" if steps else None,
    )
    # The first attempt died before its first checkpoint reached the disk: its step 1 is recorded, nothing saved.
    for saved in ("checkpoints", ".best", "best"):
        path = job_dir / saved
        path.unlink() if path.is_symlink() else shutil.rmtree(path)
    assert [r.step for r in _metrics(job_dir)] == [1]

    resumed = run_job(spec, fresh_data_dir, job_dir, job_file_dir=tmp_path, resume=True)
    assert (resumed.status, resumed.step) == ("completed", 3)
    assert [r.step for r in _metrics(job_dir)] == [1, 2, 3]


def test_held_out_evaluation_through_the_merged_copy_equals_the_students_own(tiny_model_dir, tmp_path, fresh_data_dir):
    """The trainer evaluates through its merged rollout copy (faster) only where the copy holds the policy."""
    from appliance.grpo.evaluate import evaluate_student

    spec = _spec(
        tiny_model_dir,
        tmp_path,
        fresh_data_dir,
        engine={"rollout": "hf", "rollout_weights": "merged_copy"},
        grpo={"steps": 1, "temperature": 1.0},
    )
    trainer = build_trainer(spec, tmp_path, fresh_data_dir, fresh_data_dir / "jobs" / "tiny", one_process())
    assert trainer._policy_engine(adapter=False) is trainer.engine  # step 0: the copy is the base

    def same(evaluated, direct) -> None:
        assert [e["completion"] for e in evaluated.examples] == [e["completion"] for e in direct.examples]
        assert evaluated.reward_means == pytest.approx(direct.reward_means)

    def direct(adapter: bool):
        task = trainer.source.task
        rewards = rule_rewards(trainer.source.rewards)
        return evaluate_student(trainer.student, task, task.held_out, rewards, 12, use_adapter=adapter)

    same(trainer.evaluate_held_out(adapter=False), direct(adapter=False))
    trainer.train_step()
    assert trainer._policy_engine(adapter=True) is trainer.engine
    assert trainer._policy_engine(adapter=False) is None  # after an update only the student can switch it off
    same(trainer.evaluate_held_out(adapter=True), direct(adapter=True))
    trainer.close()
