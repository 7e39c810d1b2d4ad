"""A StepRecord as flat scalar series: "reward_mean", "rewards/correctness/mean", "seconds/train", ...

Trackers plot named scalars per step; nested records become slash-separated
names (TensorBoard and W&B both group by the prefix). Text, None and the
step itself are left out; booleans become 0/1.
"""

from __future__ import annotations

import math

SKIPPED = {"step", "steps_total", "time", "job"}  # the axis and labels of a series, not series themselves


def _walk(prefix: str, value, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _walk(f"{prefix}/{key}" if prefix else str(key), inner, out)
    elif isinstance(value, bool):  # before the number case: a bool is an int to Python
        out[prefix] = float(value)
    elif isinstance(value, (int, float)) and math.isfinite(value):  # NaN and inf would break a tracker's plot
        out[prefix] = float(value)


def flatten_record(record) -> dict[str, float]:
    """{series name: value} for one step record (a StepRecord, or its dict form)."""
    data = record.to_dict() if hasattr(record, "to_dict") else dict(record)
    out: dict[str, float] = {}
    for key, value in data.items():
        if key not in SKIPPED:
            _walk(key, value, out)
    return out
