"""The learning test: GRPO on examples/multiply.yaml makes the bundled model measurably better.

Trains the real 4-bit + LoRA student on the CPU with the demo job as `make demo`
does, but for its first STEPS steps only, and compares greedy held-out accuracy
before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.model]

# Measured on this CPU: held-out accuracy 28% -> 81%, format 51% -> 100% in the demo's 30 steps; 28% -> 85%,
# format 49% -> 100% on 2026-11-28 with the bf16 rollout copy and the shared-prompt update. Its curve
# (held-out every 3 steps, 2026-11-24): 28% -> 60, 73, 71, 74, 74% after steps 3-15, format 0.98-1.00 from
# step 3. CI trains 6 steps (10 until 2026-11-27: 28% -> 71% in 239 s of steps); the margins below were set
# before that curve was measured and are not tuned.
STEPS = 6
MIN_ACCURACY_GAIN = 0.15
MIN_FORMAT_COMPLIANCE = 0.90
MIN_FORMAT_GAIN = 0.20


def test_multiply_demo_improves_held_out_accuracy(fresh_data_dir, tmp_path):
    data_dir = fresh_data_dir
    job = yaml.safe_load((REPO_ROOT / "examples" / "multiply.yaml").read_text())
    job["grpo"]["steps"] = STEPS
    job_file = tmp_path / "multiply.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "appliance",
            "train",
            str(job_file),
            "--data-dir",
            str(data_dir),
            "--eval",
        ],
        capture_output=True,
        text=True,
        timeout=20 * 60,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((data_dir / "jobs" / "multiply-demo" / "eval.json").read_text())
    before, after = summary["before"], summary["after"]
    metrics = [
        json.loads(line) for line in (data_dir / "jobs" / "multiply-demo" / "metrics.jsonl").read_text().splitlines()
    ]
    print(
        f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}, "
        f"format {before['format_compliance']:.3f} -> {after['format_compliance']:.3f}"
    )
    assert before["problems"] >= 100 and after["problems"] == before["problems"]
    assert len(metrics) == STEPS
    assert after["accuracy"] - before["accuracy"] >= MIN_ACCURACY_GAIN
    assert after["format_compliance"] >= MIN_FORMAT_COMPLIANCE
    assert after["format_compliance"] - before["format_compliance"] >= MIN_FORMAT_GAIN
    assert after["reward_means"]["total"] > before["reward_means"]["total"]
    first, last = metrics[: len(metrics) // 3], metrics[-(len(metrics) // 3) :]
    assert sum(m["reward_mean"] for m in last) / len(last) > sum(m["reward_mean"] for m in first) / len(first)
