"""From the daemon's answers to what the widgets show: the one place that knows the API's shapes.

Pure functions over appliance.service.api types and StepRecords; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from appliance.service.api import JobSummary, SlotStatus, StepRecord
from appliance.service.samples import group_records
from tui.widgets.job_table import JobRow
from tui.widgets.memory_bar import MemoryView
from tui.widgets.reward_chart import Points

TREND_STEPS = 16  # steps of reward in a job row's trend: enough to see a direction, few to fetch per refresh


def job_row(job: JobSummary, records: Sequence[StepRecord], budget_bytes: int | None, marked: bool) -> JobRow:
    last = records[-1] if records else None
    return JobRow(
        id=job.id,
        name=job.name,
        state=job.state,
        step=job.step,
        steps_total=job.steps_total,
        rewards=tuple(record.reward_mean for record in records[-TREND_STEPS:]),
        tokens_per_second=last.student_tokens_per_second if last else None,
        memory_used_bytes=memory_used(last) if last else None,
        memory_budget_bytes=budget_bytes,
        created=job.created,
        marked=marked,
    )


def memory_used(record: StepRecord) -> int:
    """The device's use when it can tell (CUDA), else the worker's peak RSS (CPU)."""
    memory = record.memory
    return memory.device_used_bytes if memory.device_used_bytes is not None else memory.peak_rss_bytes


def memory_view(slot: SlotStatus) -> MemoryView:
    return MemoryView(
        planned_bytes=dict(slot.planned_bytes),
        used_bytes=dict(slot.measured_bytes),
        budget_bytes=slot.budget_bytes,
        device_total_bytes=slot.total_bytes or None,
        device_used_bytes=slot.used_bytes if slot.total_bytes else None,
    )


def plan_memory_view(plan: dict) -> MemoryView:
    device = plan.get("device") or {}
    return MemoryView(
        planned_bytes=dict(plan.get("components") or {}),
        budget_bytes=plan.get("budget_bytes"),
        device_total_bytes=device.get("total_bytes") or None,
        device_used_bytes=device.get("used_bytes") if device.get("total_bytes") else None,
    )


def series(records: Sequence[StepRecord], value) -> Points:
    """(step, value(record)) for every record where value() is not None."""
    points = []
    for record in records:
        y = value(record)
        if y is not None:
            points.append((record.step, float(y)))
    return points


def reward_series(records: Sequence[StepRecord]) -> dict[str, Points]:
    """The weighted reward mean, then each reward function's mean."""
    names = sorted({name for record in records for name in record.rewards})
    result = {"total": series(records, lambda r: r.reward_mean)}
    for name in names:
        result[name] = series(records, lambda r, n=name: r.rewards[n].mean if n in r.rewards else None)
    return result


def accuracy_points(records: Sequence[StepRecord]) -> Points:
    return series(records, lambda r: r.eval.accuracy if r.eval is not None else None)


def seconds_per_step(records: Sequence[StepRecord], window: int = 10) -> float | None:
    """Mean of the recent steps' wall seconds (the ETA's pace)."""
    recent = [r.seconds["step"] for r in records[-window:] if "step" in r.seconds]
    return sum(recent) / len(recent) if recent else None


def group_samples(records: Sequence[dict]) -> dict[int, list[list[dict]]]:
    """samples.jsonl lines -> step -> groups (completions of one question, or trajectories of one scenario)."""
    return group_records(records)
