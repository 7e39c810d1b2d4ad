"""The widgets' formatting rules: the numbers people read on screen."""

from __future__ import annotations

from tui.widgets import formatting
from tui.widgets.job_table import JobRow, cells, sort_rows
from tui.widgets.memory_bar import stacked_bar
from tui.widgets.reward_chart import step_ticks


def test_durations_and_bytes():
    assert [formatting.duration(s) for s in (0, 42, 185, 7620, 3 * 86400 + 4 * 3600)] == [
        "0s",
        "42s",
        "3m05s",
        "2h07m",
        "3d04h",
    ]
    assert formatting.duration(None) == formatting.MISSING
    assert formatting.gib(3 * 2**30 + 2**29) == "3.5 GiB"
    assert formatting.used_of(2**30, None) == "1.0/– GiB"
    assert formatting.eta(10, 50, 9.0) == 360.0 and formatting.eta(0, 50, None) is None


def test_bars_and_trend():
    assert formatting.progress_bar(37, 50, 10) == "███████░░░"
    assert formatting.progress_bar(0, 0, 4) == "░░░░"
    assert formatting.sparkline([0.0, 0.5, 1.0], 8) == "▁▅█"
    assert formatting.sparkline([1.0, 2.0, 3.0, 4.0], 2) == "▁█"  # only the last `width` values
    assert len(set(formatting.sparkline([0.3, 0.3], 4))) == 1


def test_step_ticks_are_whole_and_span_the_run():
    assert step_ticks([1, 2, 3]) == [1, 2, 3]
    ticks = step_ticks(list(range(1, 51)))
    assert ticks[0] == 1 and ticks[-1] == 50 and len(ticks) <= 5
    assert all(isinstance(tick, int) for tick in ticks)


def test_budget_mark_sits_at_its_share_of_the_device():
    bar = stacked_bar({"student_weights": 25, "activations": 25}, scale=100, width=20, budget=90)
    assert bar.plain == "█" * 10 + "░" * 8 + "│" + "░"


def test_rows_sort_and_fit_eighty_columns():
    rows = [
        JobRow("a" * 10, "old", "succeeded", 5, 5, (0.2,), created=1.0),
        JobRow("b" * 10, "a-very-long-job-name-indeed", "running", 3, 10, (0.1, 0.9), created=2.0),
    ]
    assert [row.name for row in sort_rows(rows, "age")] == ["a-very-long-job-name-indeed", "old"]
    assert [row.name for row in sort_rows(rows, "reward")][0] == "a-very-long-job-name-indeed"
    compact = cells(rows[1], now=10.0, compact=True)
    assert compact[0].plain == " a-very-long-job…" and "3/10" in compact[2]
    wide = cells(rows[1], now=10.0, compact=False)
    assert wide[1] == "b" * 10 and wide[-1] == "8s"
