"""Per-job series with several slots: a bounded device label (the slot), removed when the job ends, counters summed right."""

from __future__ import annotations

from test_training_metrics import step_record


def test_two_jobs_on_two_slots_keep_their_own_gauges(metrics, scrape):
    assert scrape().value("appliance_reward_mean", device="0") is None  # absent, not 0, before the first step
    assert scrape().families["appliance_loss"].samples == []
    metrics.observe_step(step_record(1), "0")
    metrics.observe_step(step_record(4), "1")
    metrics.observe_planned({"student_weights": 100}, 1000, "0")
    metrics.observe_planned({"student_weights": 300}, 3000, "1")
    got = scrape()
    assert (
        got.value("appliance_reward_mean", device="0") == 0.25 and got.value("appliance_reward_mean", device="1") == 1.0
    )
    assert got.value("appliance_memory_planned_bytes", component="student_weights", device="1") == 300
    assert got.value("appliance_memory_budget_bytes", device="0") == 1000
    assert got.value("appliance_generation_tokens_per_second", role="student", device="1") == 200.0


def test_the_series_of_a_finished_job_are_removed_and_the_other_slot_kept(metrics, scrape):
    metrics.observe_step(step_record(1), "0")
    metrics.observe_step(step_record(2), "1")
    metrics.observe_planned({"student_weights": 100}, 1000, "0")
    metrics.forget_slot("0")
    got = scrape()
    slots = {sample.labels.get("device") for family in got.families.values() for sample in family.samples}
    assert "0" not in slots and "1" in slots
    assert got.value("appliance_reward_mean", device="1") == 0.5
    assert got.value("appliance_memory_planned_bytes", component="student_weights", device="0") is None
    assert got.value("appliance_train_steps_total") == 2  # counters stay


def test_judge_requests_are_summed_across_slots_without_over_counting(metrics, scrape):
    # Each job reports its own cumulative totals; interleaved, the counter must grow by each job's increase.
    for step, (a, b) in enumerate([(10, 1), (20, 2), (30, 3)], start=1):
        metrics.observe_step(step_record(step, judge_outcomes={"ok": a}), "0")
        metrics.observe_step(step_record(step, judge_outcomes={"ok": b}), "1")
    assert scrape().value("appliance_judge_requests_total", outcome="ok") == 33
    metrics.forget_slot("1")  # a new job on slot 1 starts its totals from 0
    metrics.observe_step(step_record(1, judge_outcomes={"ok": 5}), "1")
    assert scrape().value("appliance_judge_requests_total", outcome="ok") == 38
