"""The appliance_* metrics, scraped over real HTTP after feeding them StepRecords, the plan and the ledger."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from appliance.budget.device_probe import DeviceInfo
from appliance.budget.memory_ledger import Ledger
from appliance.budget.phase_memory import COMPONENTS
from appliance.budget.plan import plan_job
from appliance.budget.shapes import load_config
from appliance.config.job_file import load_job
from appliance.grpo.step_record import EvalResult, MemoryReading, RewardStats, StepRecord
from appliance.models.provision import DEMO_MODEL_NAME
from appliance.models.store import ModelStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multiply.yaml"
GiB = 2**30


def step_record(step: int, checkpoint: bool = False, judge_outcomes: dict | None = None, **overrides) -> StepRecord:
    """A StepRecord as the trainer builds it after a step (the values are chosen, the type is the real one)."""
    seconds = {"generate": 8.0, "reward": 0.02, "train": 20.0, "sync": 0.3, "step": 28.32}
    if checkpoint:
        seconds["checkpoint"] = 1.5
    values = dict(
        job="multiply-demo",
        step=step,
        steps_total=30,
        time=1.79e9 + step,
        reward_mean=0.25 * step,
        reward_std=0.4,
        rewards={"correctness": RewardStats(0.1 * step, 0.3), "answer_format": RewardStats(0.9, 0.1)},
        loss=-0.012 * step,
        kl=0.003 * step,
        clip_ratio=0.05,
        grad_norm=0.8,
        learning_rate=2e-4,
        nonfinite=False,
        groups_informative=3,
        groups_total=4,
        trained_sequences=24,
        trained_tokens=600,
        micro_batch_size=8,
        completions=32,
        completion_length_mean=12.5,
        completion_length_max=24,
        generated_tokens={"student": 400 + step},
        prompt_tokens={"student": 1200},
        tokens_per_second={"student": 50.0 * step},
        seconds=seconds,
        memory=MemoryReading(
            peak_rss_bytes=3 * GiB,
            planned_peak_bytes=4 * GiB,
            device_used_bytes=None,
            phase_peak_bytes={},
            components_used_bytes={},
        ),
        judge_outcomes=judge_outcomes or {},
    )
    values.update(overrides)
    return StepRecord(**values)


@pytest.fixture(scope="module")
def plan(store_data_dir):
    job = load_job(EXAMPLE)
    student_config = load_config(ModelStore(store_data_dir).get(DEMO_MODEL_NAME).path / "config.json")
    return plan_job(job, student_config, None, DeviceInfo("cpu", 24 * GiB, 3 * GiB, "x86_64"))


def test_two_trainer_steps_add_up_in_the_counters_and_the_gauges_show_the_last(metrics, scrape):
    metrics.observe_step(step_record(1))
    metrics.observe_step(StepRecord.from_dict(step_record(2, checkpoint=True).to_dict()))  # a metrics.jsonl line
    got = scrape()

    assert got.value("appliance_generated_tokens_total", role="student") == 401 + 402
    assert got.value("appliance_prompt_tokens_total", role="student") == 2400
    assert got.value("appliance_completions_total") == 64
    assert got.value("appliance_train_steps_total") == 2
    assert got.value("appliance_reward_mean", device="0") == 0.5
    assert got.value("appliance_reward_std", device="0") == 0.4
    assert got.value("appliance_loss", device="0") == pytest.approx(-0.024)
    assert got.value("appliance_kl", device="0") == pytest.approx(0.006)
    assert got.value("appliance_clip_ratio", device="0") == 0.05
    assert got.value("appliance_last_step_timestamp_seconds", device="0") == step_record(2).time
    assert got.value("appliance_generation_tokens_per_second", role="student", device="0") == 100.0
    assert got.value("appliance_step_duration_seconds_count", phase="train") == 2
    assert got.value("appliance_step_duration_seconds_sum", phase="train") == 40.0
    assert got.value("appliance_step_duration_seconds_bucket", phase="train", le="30.0") == 2
    assert got.value("appliance_step_duration_seconds_bucket", phase="train", le="10.0") == 0
    assert got.value("appliance_step_duration_seconds_count", phase="checkpoint") == 1
    phases = {labels["phase"] for labels in got.label_sets("appliance_step_duration_seconds")}
    assert phases == {"generate", "reward", "train", "sync", "checkpoint"}  # "step" is the total, not a phase


def test_skipped_updates_and_held_out_accuracy_reach_their_metrics(metrics, scrape):
    metrics.observe_step(step_record(1, nonfinite=True))
    metrics.observe_step(
        step_record(2, eval=EvalResult(accuracy=0.62, format_compliance=0.9, reward_mean=1.1, problems=100))
    )
    metrics.observe_step(step_record(3, nonfinite=True))
    got = scrape()
    assert got.value("appliance_nonfinite_steps_total") == 2
    assert got.value("appliance_eval_accuracy", device="0") == 0.62
    assert got.value("appliance_train_steps_total") == 3


def test_plan_ledger_device_and_disk_fill_the_memory_gauges(metrics, scrape, plan, tmp_path):
    ledger = Ledger(plan)
    ledger.measure("student_weights", 150_000_000)
    ledger.measure("rollout_weights", 270_000_000)
    metrics.observe_plan(plan)
    metrics.observe_ledger(ledger)
    metrics.observe_device(DeviceInfo("cpu", 24 * GiB, 5 * GiB, "x86_64"))
    metrics.observe_disk(tmp_path)
    got = scrape()

    for component in COMPONENTS:
        assert (
            got.value("appliance_memory_planned_bytes", component=component, device="0") == plan.components[component]
        )
    assert plan.components["student_weights"] > 0 and plan.components["judge_weights"] == 0
    assert {labels["component"] for labels in got.label_sets("appliance_memory_used_bytes")} == set(COMPONENTS)
    assert got.value("appliance_memory_used_bytes", component="student_weights", device="0") == 150_000_000
    assert got.value("appliance_memory_used_bytes", component="rollout_weights", device="0") == 270_000_000
    assert got.value("appliance_memory_used_bytes", component="optimizer", device="0") == 0
    assert got.value("appliance_memory_budget_bytes", device="0") == plan.budget_bytes == int(0.9 * 24 * GiB)
    assert got.value("appliance_device_memory_total_bytes", device="0") == 24 * GiB
    assert got.value("appliance_device_memory_used_bytes", device="0") == 5 * GiB
    free = got.value("appliance_disk_free_bytes")
    assert 0 < free and abs(free - shutil.disk_usage(tmp_path).free) < 256 * 2**20


def test_judge_counters_only_go_up_and_a_new_judge_counts_on(metrics, scrape):
    steps = [  # the judge's cumulative outcomes in each record; tokens and seconds are per step
        ({"ok": 3, "parse_error": 1, "timeout": 0}, 90, 300, 2.0),
        ({"ok": 7, "parse_error": 1, "timeout": 2}, 160, 500, 3.0),
        ({"ok": 7, "parse_error": 1, "timeout": 2}, 0, 0, 0.0),  # a step without judging
        ({"ok": 2, "parse_error": 0, "timeout": 0}, 40, 100, 1.0),  # a new job's judge: totals restart
    ]
    seen = []
    for index, (outcomes, generated, prompt, seconds) in enumerate(steps, start=1):
        record = step_record(index, judge_outcomes=outcomes)
        record = dataclasses.replace(
            record,
            generated_tokens={**record.generated_tokens, "judge": generated},
            prompt_tokens={**record.prompt_tokens, "judge": prompt},
            tokens_per_second={**record.tokens_per_second, "judge": generated / seconds if seconds else 0.0},
            seconds={**record.seconds, **({"judge": seconds} if seconds else {})},
        )
        metrics.observe_step(record)
        got = scrape()
        seen.append({outcome: got.value("appliance_judge_requests_total", outcome=outcome) for outcome in outcomes})
        seen[-1]["generated"] = got.value("appliance_generated_tokens_total", role="judge")
        seen[-1]["prompt"] = got.value("appliance_prompt_tokens_total", role="judge")

    assert [s["ok"] for s in seen] == [3, 7, 7, 9]
    assert [s["timeout"] for s in seen] == [0, 2, 2, 2]
    assert [s["parse_error"] for s in seen] == [1, 1, 1, 1]
    assert [s["generated"] for s in seen] == [90, 250, 250, 290]
    assert [s["prompt"] for s in seen] == [300, 800, 800, 900]
    assert got.value("appliance_generation_tokens_per_second", role="judge", device="0") == 40.0
    # Judging time per step: 2 s, 3 s, nothing, then 1 s from the new judge.
    assert got.value("appliance_step_duration_seconds_count", phase="judge") == 3
    assert got.value("appliance_step_duration_seconds_sum", phase="judge") == 6.0


def test_build_info_jobs_and_no_job_or_step_label_anywhere(metrics, scrape, plan):
    metrics.observe_step(
        step_record(
            1,
            checkpoint=True,
            judge_outcomes={"ok": 1},
            generated_tokens={"student": 401, "judge": 5},
            prompt_tokens={"student": 9},
        )
    )
    metrics.observe_plan(plan)
    metrics.observe_ledger(Ledger(plan))
    metrics.set_jobs({"running": 1, "queued": 2})
    metrics.set_jobs({"running": 1, "succeeded": 1})
    got = scrape()

    assert got.label_sets("appliance_build_info") == [
        {"version": "0.1.0", "student_model": "smollm2-135m-instruct", "judge_model": "qwen2.5-7b-instruct"}
    ]
    assert (
        got.value(
            "appliance_build_info",
            version="0.1.0",
            student_model="smollm2-135m-instruct",
            judge_model="qwen2.5-7b-instruct",
        )
        == 1
    )
    assert got.value("appliance_jobs", state="queued") == 0
    assert got.value("appliance_jobs", state="succeeded") == 1
    assert got.value("appliance_jobs", state="running") == 1
    assert "job" not in got.all_label_names() and "step" not in got.all_label_names()
    appliance_families = {name for name in got.families if name.startswith("appliance_")}
    assert appliance_families == {
        "appliance_generated_tokens",
        "appliance_prompt_tokens",
        "appliance_completions",
        "appliance_train_steps",
        "appliance_step_duration_seconds",
        "appliance_generation_tokens_per_second",
        "appliance_reward_mean",
        "appliance_reward_std",
        "appliance_kl",
        "appliance_loss",
        "appliance_clip_ratio",
        "appliance_last_step_timestamp_seconds",
        "appliance_memory_planned_bytes",
        "appliance_memory_used_bytes",
        "appliance_memory_budget_bytes",
        "appliance_device_memory_total_bytes",
        "appliance_device_memory_used_bytes",
        "appliance_judge_requests",
        "appliance_jobs",
        "appliance_disk_free_bytes",
        "appliance_build_info",
        "appliance_eval_accuracy",
        "appliance_nonfinite_steps",
        "appliance_nonfinite_steps_created",
        # prometheus_client's creation timestamps of the counters and the histogram
        "appliance_generated_tokens_created",
        "appliance_prompt_tokens_created",
        "appliance_completions_created",
        "appliance_train_steps_created",
        "appliance_step_duration_seconds_created",
        "appliance_judge_requests_created",
    }
