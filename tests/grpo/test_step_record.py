"""StepRecord is one metrics.jsonl line: a lossless round trip, tolerant of other versions' keys, stdlib only."""

from __future__ import annotations

import json
import subprocess
import sys

from appliance.grpo.step_record import EvalResult, MemoryReading, RewardStats, RunEvent, RunResult, StepRecord


def _record(**overrides) -> StepRecord:
    values = dict(
        job="multiply-demo",
        step=3,
        steps_total=30,
        time=1.79e9,
        reward_mean=0.75,
        reward_std=0.5,
        rewards={"correctness": RewardStats(0.5, 0.5), "judge": RewardStats(0.25, 0.1)},
        loss=-0.01,
        kl=0.002,
        clip_ratio=0.1,
        grad_norm=0.9,
        learning_rate=5e-5,
        nonfinite=False,
        groups_informative=3,
        groups_total=4,
        trained_sequences=24,
        trained_tokens=480,
        micro_batch_size=8,
        completions=32,
        completion_length_mean=15.0,
        completion_length_max=32,
        generated_tokens={"student": 480, "judge": 96},
        prompt_tokens={"student": 2048},
        tokens_per_second={"student": 60.0, "judge": 30.0},
        seconds={
            "generate": 8.0,
            "judge": 3.2,
            "reward": 0.01,
            "train": 12.0,
            "sync": 0.1,
            "checkpoint": 0.7,
            "step": 24.0,
        },
        memory=MemoryReading(
            peak_rss_bytes=3_000_000_000,
            planned_peak_bytes=3_300_000_000,
            device_used_bytes=None,
            phase_peak_bytes={"train": 2_000_000_000},
            components_used_bytes={"student_lora": 9_000},
        ),
        eval=EvalResult(accuracy=0.81, format_compliance=1.0, reward_mean=2.1, problems=100),
        logprob_diff_mean=0.01,
        logprob_diff_max=0.2,
        judge_outcomes={"ok": 30, "parse_error": 2, "timeout": 0},
    )
    values.update(overrides)
    return StepRecord(**values)


def test_a_record_survives_a_json_line_round_trip_unchanged():
    record = _record()
    line = json.dumps(record.to_dict())
    assert StepRecord.from_dict(json.loads(line)) == record
    assert StepRecord.from_dict(json.loads(json.dumps(_record(eval=None).to_dict()))).eval is None


def test_unknown_keys_from_a_newer_version_are_ignored_and_old_scalar_token_counts_load():
    data = _record().to_dict()
    data["a_field_from_the_future"] = {"x": 1}
    data["memory"]["another_future_reading"] = 5
    assert StepRecord.from_dict(data) == _record()
    old = _record().to_dict()
    for key in ("job", "steps_total", "nonfinite", "judge_outcomes", "eval"):
        del old[key]
    old["generated_tokens"], old["prompt_tokens"], old["tokens_per_second"] = 480, 2048, 60.0
    loaded = StepRecord.from_dict(old)
    assert loaded.generated_tokens == {"student": 480} and loaded.tokens_per_second == {"student": 60.0}
    assert loaded.nonfinite is False and loaded.steps_total == 3 and loaded.judge_outcomes == {}


def test_events_and_results_are_plain_data():
    event = RunEvent(kind="checkpoint", step=20, data={"path": "/x/step-000020", "best": True}, time=1.0)
    assert RunEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event
    result = RunResult(
        status="stopped", step=20, stop_reason="pause", best={"step": 20}, eval_before=None, eval_after=None
    )
    assert json.loads(json.dumps(result.to_dict()))["stop_reason"] == "pause"


def test_importing_the_record_module_loads_no_heavy_library():
    code = (
        "import sys, appliance.grpo.step_record; "
        "print(sorted(m for m in ('torch', 'numpy', 'pydantic', 'transformers', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_run_seam_and_the_exporter_import_nothing_from_the_cli():
    code = (
        "import sys, appliance.grpo.run, appliance.metrics.run_exporter; "
        "print(sorted(m for m in sys.modules if m.startswith('appliance.cli')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
