"""A run killed after its step-2 checkpoint and resumed draws exactly what an uninterrupted run draws."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from store_support import link_model_store

pytestmark = pytest.mark.model

JOB = {
    "name": "resume-check",
    "student": {"model": "smollm2-135m-instruct", "quantization": "nf4", "lora": {"rank": 8, "alpha": 16}},
    "task": {
        "dataset": "builtin:multiply",
        "operand_min": 2,
        "operand_max": 20,
        "held_out": 100,
        "system_prompt": "Reply with the answer in the form <answer>N</answer>.",
    },
    "rewards": [{"name": "correctness", "weight": 1.0}, {"name": "answer_format", "weight": 0.5}],
    "grpo": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 8, "learning_rate": 5.0e-4, "steps": 4},
    "checkpoint": {"every": 2, "keep_last": 2, "eval_every": None},
}


def _train(job_file: Path, data_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "appliance", "train", str(job_file), "--data-dir", str(data_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _steps(job_dir: Path, table: str) -> dict[int, list[dict]]:
    by_step: dict[int, list[dict]] = {}
    for line in (job_dir / table).read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row["step"], []).append(row)
    return by_step


def test_kill_after_checkpoint_and_resume_matches_uninterrupted_run(tmp_path, store_data_dir):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(JOB))
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    for data_dir in (straight, interrupted):
        link_model_store(store_data_dir, data_dir)

    run = _train(job_file, straight)
    output, _ = run.communicate(timeout=900)
    assert run.returncode == 0, output

    victim = _train(job_file, interrupted)
    checkpoint = interrupted / "jobs" / "resume-check" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.monotonic() + 600
    while not checkpoint.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert checkpoint.exists(), "no step-2 checkpoint appeared"
    victim.send_signal(signal.SIGKILL)  # dies somewhere in step 3
    victim.wait()
    assert victim.returncode == -signal.SIGKILL

    resumed = _train(job_file, interrupted, "--resume")
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output
    assert "resumed 'resume-check' at step 2" in output

    straight_dir, resumed_dir = straight / "jobs" / "resume-check", interrupted / "jobs" / "resume-check"
    expected, got = _steps(straight_dir, "samples.jsonl"), _steps(resumed_dir, "samples.jsonl")
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        assert [(r["question"], r["completion"], r["reward"]) for r in got[step]] == [
            (r["question"], r["completion"], r["reward"]) for r in expected[step]
        ]
    expected_metrics, got_metrics = _steps(straight_dir, "metrics.jsonl"), _steps(resumed_dir, "metrics.jsonl")
    for step in (3, 4):
        assert len(got_metrics[step]) == 1  # the killed step left no duplicate line
        assert got_metrics[step][0]["reward_mean"] == expected_metrics[step][0]["reward_mean"]
        assert got_metrics[step][0]["loss"] == pytest.approx(expected_metrics[step][0]["loss"], abs=1e-6)
    final = json.loads((resumed_dir / "checkpoints" / "step-000004" / "state.json").read_text())
    assert (
        final["data_cursor"]
        == json.loads((straight_dir / "checkpoints" / "step-000004" / "state.json").read_text())["data_cursor"]
    )
