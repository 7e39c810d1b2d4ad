"""The jobs table: one row per job, rebuilt from `JobRow`s (formatting only; no I/O).

A `JobRow` is what the table shows about a job, in base units; the jobs
screen builds them from the daemon's answers. Rows are keyed by job id, so
the cursor stays on the same job when the list is refreshed or re-sorted.
Below WIDE_COLUMNS the table drops the id and age columns and merges the
trend into the reward column, so that it fits an 80-column terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import DataTable

from tui.widgets import formatting

WIDE_COLUMNS = 100  # terminal cells under which the table switches to its compact columns (see the docstring)
NAME_WIDTH = 16  # longer job names are cut with an ellipsis, so the columns after them stay aligned

# Sort keys the operator cycles through with `s`.
SORTS = ("age", "state", "name", "reward")

# Colors by name (16-color safe: SSH sessions often lack truecolor).
STATE_STYLES = {
    "queued": "yellow",
    "running": "green",
    "paused": "cyan",
    "interrupted": "magenta",
    "succeeded": "blue",
    "failed": "red",
    "cancelled": "bright_black",
}


@dataclass(frozen=True)
class JobRow:
    id: str
    name: str
    state: str
    step: int
    steps_total: int
    rewards: tuple[float, ...] = ()  # reward mean of recent steps, oldest first
    tokens_per_second: float | None = None
    memory_used_bytes: int | None = None
    memory_budget_bytes: int | None = None
    created: float | None = None  # epoch seconds
    marked: bool = False  # picked for comparison

    @property
    def reward(self) -> float | None:
        return self.rewards[-1] if self.rewards else None


def sort_rows(rows: list[JobRow], key: str) -> list[JobRow]:
    """Newest first by default; other keys break ties by newest."""
    newest = sorted(rows, key=lambda row: -(row.created or 0.0))
    if key == "state":
        return sorted(newest, key=lambda row: row.state)
    if key == "name":
        return sorted(newest, key=lambda row: row.name.lower())
    if key == "reward":
        return sorted(newest, key=lambda row: -(row.reward if row.reward is not None else float("-inf")))
    return newest


def columns(compact: bool) -> list[str]:
    if compact:
        return ["name", "state", "step", "reward", "tok/s", "memory"]
    return ["", "id", "name", "state", "step", "reward", "trend", "tok/s", "memory", "age"]


def cells(row: JobRow, now: float, compact: bool) -> list:
    state = Text(row.state, style=f"bold {STATE_STYLES.get(row.state, '')}".strip())
    mark = "●" if row.marked else " "
    name = Text(row.name if len(row.name) <= NAME_WIDTH else row.name[: NAME_WIDTH - 1] + "…")  # never markup
    if compact:
        return [
            Text(mark) + name,
            state,
            f"{formatting.progress_bar(row.step, row.steps_total, 5)} {row.step}/{row.steps_total}",
            f"{formatting.number(row.reward):>5} {formatting.sparkline(row.rewards, 6)}",
            formatting.rate(row.tokens_per_second),
            formatting.used_of(row.memory_used_bytes, row.memory_budget_bytes).replace(" GiB", "G"),
        ]
    return [
        mark,
        row.id,
        name,
        state,
        f"{formatting.progress_bar(row.step, row.steps_total, 8)} {row.step}/{row.steps_total}",
        formatting.number(row.reward),
        formatting.sparkline(row.rewards, 8),
        formatting.rate(row.tokens_per_second),
        formatting.used_of(row.memory_used_bytes, row.memory_budget_bytes),
        formatting.age(row.created, now),
    ]


class JobTable(DataTable):
    """Jobs as rows: id, name, state, progress, reward (last and trend), tokens/s, memory, age."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.rows_shown: list[JobRow] = []
        self.now = 0.0
        self.compact: bool | None = None

    def show(self, rows: list[JobRow], now: float) -> None:
        """Replace the rows, keeping the cursor on the job it was on."""
        self.rows_shown, self.now = list(rows), now
        selected = self.selected_id
        compact = self.size.width < WIDE_COLUMNS
        if compact != self.compact:
            self.compact = compact
            self.clear(columns=True)
            for label in columns(compact):
                self.add_column(label)
        else:
            self.clear()
        for row in rows:
            self.add_row(*cells(row, now, compact), key=row.id)
        if selected is not None and selected in {row.id for row in rows}:
            self.move_cursor(row=self.get_row_index(selected))

    def on_resize(self) -> None:
        if (self.size.width < WIDE_COLUMNS) != self.compact:
            self.show(self.rows_shown, self.now)

    @property
    def selected_id(self) -> str | None:
        if self.row_count == 0:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value
