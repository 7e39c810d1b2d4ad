"""bench/learning_curve.py: its arithmetic on hand-made curves, and a tiny real bench (2 seeds x 2 settings)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiny_model import tiny_job

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import learning_curve  # noqa: E402


def test_overrides_are_section_key_value_and_refused_otherwise():
    assert learning_curve.parse_override("grpo.learning_rate=1e-4") == (["grpo", "learning_rate"], 1e-4)
    assert learning_curve.parse_override("grpo.dynamic_sampling=true") == (["grpo", "dynamic_sampling"], True)
    for bad in ("grpo.learning_rate", "=3", "grpo..steps=2"):
        with pytest.raises(SystemExit, match="SECTION.KEY=VALUE"):
            learning_curve.parse_override(bad)


def test_a_derived_job_has_the_seed_the_evaluation_and_absolute_file_paths(tmp_path):
    job = {
        "task": {"dataset": "rows.jsonl"},
        "rewards": [{"name": "rewards.py:score"}, {"name": "correctness"}],
        "grpo": {"steps": 30},
        "checkpoint": {"every": 10},
    }
    derived = learning_curve.derive_job(job, ["grpo.steps=8", "grpo.temperature=0.8"], 2, 4, 20, tmp_path)
    assert derived["grpo"] == {"steps": 8, "temperature": 0.8, "seed": 2}
    assert derived["checkpoint"] == {"every": 10, "eval_every": 4, "eval_limit": 20}
    assert derived["task"]["dataset"] == str(tmp_path / "rows.jsonl")
    assert [r["name"] for r in derived["rewards"]] == [str(tmp_path / "rewards.py:score"), "correctness"]
    assert job["grpo"] == {"steps": 30}  # the original is untouched


def test_points_are_training_seconds_without_evaluation_and_spread_over_seeds():
    metrics = [
        {"step": 1, "seconds": {"step": 10.0}},
        {"step": 2, "seconds": {"step": 14.0, "eval": 4.0}, "eval": {"accuracy": 0.5}},
    ]
    points = learning_curve.curve(metrics, {"accuracy": 0.25})
    assert points == [{"step": 0, "seconds": 0.0, "accuracy": 0.25}, {"step": 2, "seconds": 20.0, "accuracy": 0.5}]
    other = [{"step": 0, "seconds": 0.0, "accuracy": 0.25}, {"step": 2, "seconds": 40.0, "accuracy": 0.75}]
    (start, end) = learning_curve.aggregate([points, other])
    assert start["accuracy"]["std"] == 0.0 and end["accuracy"]["mean"] == pytest.approx(0.625)
    assert (end["accuracy"]["min"], end["accuracy"]["max"], end["minutes"]["mean"]) == (0.5, 0.75, pytest.approx(0.5))
    gain = learning_curve.gain_within([points, other], minutes=0.5)  # 30 s: the second seed's point is past it
    assert (gain["mean"], gain["min"], gain["max"]) == (pytest.approx(0.125), 0.0, 0.25)


@pytest.mark.model
def test_a_tiny_bench_alternates_two_settings_over_two_seeds(tiny_model_dir, tmp_path, fresh_data_dir, capsys):
    job = tiny_job(tiny_model_dir, tmp_path, grpo={"steps": 1})
    out = tmp_path / "curve.json"
    argv = [str(job), "--seeds", "0", "1", "--compare", "grpo.dynamic_sampling=true", "--eval-every", "1"]
    argv += ["--eval-limit", "2", "--budget-minutes", "5", "--data-dir", str(fresh_data_dir), "--out", str(out)]
    assert learning_curve.main(argv) == 0
    printed = capsys.readouterr().out
    runs = [line.split(":")[0] for line in printed.splitlines() if " seed " in line]
    assert runs == ["A seed 0", "B seed 0", "A seed 1", "B seed 1"]
    result = json.loads(out.read_text())
    for name in ("A", "B"):
        points = result["summary"][name]["points"]
        assert [p["step"] for p in points] == [0, 1] and all(p["accuracy"]["n"] == 2 for p in points)
        assert points[1]["minutes"]["mean"] > points[0]["minutes"]["mean"] == 0
        assert result["summary"][name]["gain_within_budget"]["n"] == 2
    assert "setting B: grpo.dynamic_sampling=true" in printed
