"""The auto-fit's reasons are data: each names the alternative and its peak; describe() words them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from appliance.budget.device_probe import DeviceInfo
from appliance.budget.fit import Peaks
from appliance.budget.phase_memory import Sizing
from appliance.budget.plan import plan_job
from appliance.budget.reasons import FitReason, describe
from appliance.budget.shapes import fixture_for, load_config
from appliance.budget.workload import workload_of
from appliance.config.job_file import load_job

GIB = 2**30
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gsm8k-qwen7b-gpu.yaml"


@pytest.fixture(scope="module")
def plan_80gib():
    job = load_job(EXAMPLE)
    configs = load_config(fixture_for(job.student.model)), load_config(fixture_for(job.judge.model))
    return plan_job(job, *configs, DeviceInfo("cuda", 80 * GIB, 0, "fake"))


def test_time_sharing_is_explained_by_the_peak_with_every_engine_awake(plan_80gib):
    reason = plan_80gib.choices.reasons["time_share"]

    assert reason.kind == "awake_too_big"
    assert reason.needs_bytes > reason.budget_bytes == plan_80gib.budget_bytes
    assert describe("time_share", reason).startswith("on: with every engine awake the step needs ")


def test_a_batch_below_its_limit_names_the_next_larger_size_and_its_peak(plan_80gib):
    reason = plan_80gib.choices.reasons["judge_batch"]

    assert reason.kind in ("larger_needs", "all_fit")
    if reason.kind == "larger_needs":
        assert reason.larger > plan_80gib.choices.judge_batch
        assert reason.needs_bytes > plan_80gib.budget_bytes


def test_the_words_name_the_larger_size_its_peak_and_the_budget():
    reason = FitReason("larger_needs", 10 * GIB, larger=64, needs_bytes=12 * GIB)

    assert (
        describe("rollout_batch", reason)
        == "sequences generated at once: 64 would need 12.00 GiB > the 10.00 GiB budget"
    )


def test_the_wire_form_of_the_choices_carries_the_words(plan_80gib):
    wire = plan_80gib.choices.to_dict()["reasons"]

    assert wire == {key: describe(key, reason) for key, reason in plan_80gib.choices.reasons.items()}
    assert all(isinstance(words, str) and words for words in wire.values())


def test_an_alternative_asked_for_twice_is_planned_once():
    job = load_job(EXAMPLE)
    configs = load_config(fixture_for(job.student.model)), load_config(fixture_for(job.judge.model))
    peaks = Peaks(workload_of(job, *configs, "cuda"))
    sizing = Sizing(1, False, "shared", True, 8, 1)

    first, again = peaks(sizing, rollout_batch=16), peaks(sizing, rollout_batch=16)

    assert first == again > 0 and list(peaks.plans) == [replace(sizing, rollout_batch=16)]


def test_a_reason_without_wording_is_refused():
    with pytest.raises(ValueError, match="no wording for the fit reason 'guess'"):
        describe("time_share", FitReason("guess"))  # type: ignore[arg-type]
