"""The jobs table: one row per job, rebuilt from `JobRow`s (formatting only; no I/O).

A `JobRow` is what the table shows about a job, in base units; the jobs
screen builds them from the daemon's answers. Rows are keyed by job id, so
the cursor stays on the same job when the list is refreshed or re-sorted.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import DataTable

from tui.widgets import format as fmt

PROGRESS_WIDTH = 8
TREND_WIDTH = 8

# Sort keys the operator cycles through with `s`.
SORTS = ("age", "state", "name", "reward")


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


class JobTable(DataTable):
    """Jobs as rows: id, name, state, progress, reward (last and trend), tokens/s, memory, age."""

    COLUMNS = (("", "mark"), ("id", "id"), ("name", "name"), ("state", "state"), ("step", "step"),
               ("reward", "reward"), ("trend", "trend"), ("tok/s", "tps"), ("memory", "memory"),
               ("age", "age"))

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)

    def on_mount(self) -> None:
        for label, key in self.COLUMNS:
            self.add_column(label, key=key)

    def show(self, rows: list[JobRow], now: float) -> None:
        """Replace the rows, keeping the cursor on the job it was on."""
        selected = self.selected_id
        self.clear()
        for row in rows:
            self.add_row(*self.cells(row, now), key=row.id)
        if selected is not None and selected in {row.id for row in rows}:
            self.move_cursor(row=self.get_row_index(selected))

    @property
    def selected_id(self) -> str | None:
        if self.row_count == 0:
            return None
        try:
            key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:  # the cursor is past the last row while rows change
            return None
        return key.value

    @staticmethod
    def cells(row: JobRow, now: float) -> tuple:
        state = Text(row.state, style=f"bold {STATE_STYLES.get(row.state, '')}".strip())
        progress = f"{fmt.progress_bar(row.step, row.steps_total, PROGRESS_WIDTH)} {row.step}/{row.steps_total}"
        return (
            "●" if row.marked else " ",
            row.id,
            row.name,
            state,
            progress,
            fmt.number(row.reward),
            fmt.sparkline(row.rewards, TREND_WIDTH),
            fmt.rate(row.tokens_per_second),
            fmt.used_of(row.memory_used_bytes, row.memory_budget_bytes),
            fmt.age(row.created, now),
        )


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
