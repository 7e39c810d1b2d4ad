"""The runtime ledger: measurements against the plan, and surviving an out-of-memory step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from appliance.budget.device_probe import DeviceInfo
from appliance.budget.memory_ledger import Ledger
from appliance.grpo.update import OutOfMemoryAtMinimum, halved_micro_batch
from appliance.budget.plan import plan_job
from appliance.budget.shapes import fixture_for, load_config
from appliance.config.job_file import load_job

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gsm8k-qwen7b-gpu.yaml"


@pytest.fixture(scope="module")
def plan():
    job = load_job(EXAMPLE)
    configs = load_config(fixture_for(job.student.model)), load_config(fixture_for(job.judge.model))
    return plan_job(job, *configs, DeviceInfo("cuda", 80 * 2**30, 0, "fake"))


def test_a_measurement_within_10_percent_of_its_plan_is_quiet(plan):
    ledger = Ledger(plan)
    ledger.measure("student_weights", int(plan.components["student_weights"] * 1.09))
    ledger.phase_peak("train", plan.phases["train"].peak_bytes)
    assert ledger.warnings == []


def test_a_component_more_than_10_percent_over_its_plan_warns_with_both_sizes(plan):
    ledger = Ledger(plan)
    ledger.measure("judge_weights", int(plan.components["judge_weights"] * 1.2))
    assert len(ledger.warnings) == 1
    assert "component judge_weights" in ledger.warnings[0] and "20% over its plan of 15.26 GiB" in ledger.warnings[0]


def test_a_phase_peak_over_plan_warns_and_the_largest_peak_is_kept(plan):
    ledger = Ledger(plan)
    planned = plan.phases["generate"].peak_bytes
    ledger.phase_peak("generate", int(planned * 1.5))
    ledger.phase_peak("generate", planned // 2)
    assert ledger.phase_peaks["generate"] == int(planned * 1.5)
    assert ledger.warnings and "phase generate" in ledger.warnings[0]


def test_gauges_report_planned_and_used_bytes_per_component(plan):
    ledger = Ledger(plan)
    ledger.measure("rollout_kv", 123)
    gauges = ledger.gauges()
    assert gauges["rollout_kv"] == {"planned_bytes": plan.components["rollout_kv"], "used_bytes": 123}
    assert gauges["judge_kv"]["used_bytes"] == 0
    document = ledger.to_dict()
    assert document["components"] == gauges and document["budget_bytes"] == plan.budget_bytes


def test_unknown_component_or_phase_is_refused_by_name(plan):
    ledger = Ledger(plan)
    with pytest.raises(KeyError, match="'weights' is not a planned component"):
        ledger.measure("weights", 1)
    with pytest.raises(KeyError, match="'rollout' is not a planned phase"):
        ledger.phase_peak("rollout", 1)


def test_an_out_of_memory_step_is_retried_with_half_the_micro_batch_and_recorded(plan):
    ledger = Ledger(plan)
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert halved_micro_batch(16, error, ledger) == 8
    assert halved_micro_batch(3, error, ledger) == 1
    assert [(h.from_size, h.to_size) for h in ledger.halvings] == [(16, 8), (3, 1)]
    assert "Tried to allocate 2.00 GiB" in ledger.to_dict()["oom_halvings"][0]["error"]


def test_out_of_memory_at_the_smallest_micro_batch_gives_up_with_what_to_change():
    with pytest.raises(OutOfMemoryAtMinimum, match="grpo.group_size") as raised:
        halved_micro_batch(1, torch.OutOfMemoryError("out of memory"))
    assert isinstance(raised.value.__cause__, torch.OutOfMemoryError)
