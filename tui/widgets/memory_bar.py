"""The device's memory as stacked bars, planned and used, per component, against the budget line.

Formatting only: `MemoryView` carries bytes from the daemon's device status;
the bar scales everything to the device total (or the largest figure when
the total is unknown) and marks the budget with a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tui.widgets import formatting

# Component order and colors (named colors: readable without truecolor).
COMPONENT_STYLES = {
    "student_weights": "blue",
    "student_lora": "cyan",
    "optimizer": "magenta",
    "activations": "yellow",
    "rollout_kv": "green",
    "judge_weights": "red",
    "judge_kv": "bright_red",
    "runtime": "white",
}
OTHER_STYLE = "bright_black"
BUDGET_MARK = "│"


@dataclass(frozen=True)
class MemoryView:
    planned_bytes: dict[str, int] = field(default_factory=dict)
    used_bytes: dict[str, int] = field(default_factory=dict)
    budget_bytes: int | None = None
    device_total_bytes: int | None = None
    device_used_bytes: int | None = None


def _ordered(components: dict[str, int]) -> list[tuple[str, int]]:
    known = [(name, components[name]) for name in COMPONENT_STYLES if name in components]
    others = sorted((name, value) for name, value in components.items() if name not in COMPONENT_STYLES)
    return known + others


def stacked_bar(components: dict[str, int], scale: int, width: int, budget: int | None) -> Text:
    """One line of `width` cells: each component's share of `scale`, then empty; the budget as a mark."""
    cells: list[tuple[str, str]] = []
    total = 0
    for name, value in _ordered(components):
        total += max(0, value)
        # Cells from the running total: rounding errors do not add up along the bar.
        end = int(round(total / scale * width)) if scale > 0 else 0
        while len(cells) < min(end, width):
            cells.append(("█", COMPONENT_STYLES.get(name, OTHER_STYLE)))
    while len(cells) < width:
        cells.append(("░", "bright_black"))
    if budget is not None and scale > 0:
        at = min(width - 1, int(round(budget / scale * width)))  # a budget at the device's total marks the last cell
        cells[at] = (BUDGET_MARK, "bold reverse")
    text = Text()
    for char, style in cells:
        text.append(char, style=style)
    return text


class MemoryBar(Static):
    """Planned and used bars plus a legend table of bytes per component."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.view = MemoryView()

    def on_mount(self) -> None:
        self.display = False  # nothing to draw until the first view arrives

    def show(self, view: MemoryView) -> None:
        self.view = view
        self.display = bool(view.planned_bytes or view.used_bytes)
        # The row label and padding take about a dozen cells; a narrow screen still gets a readable bar.
        self.update(self.render_view(view, max(10, self.content_size.width - 12)))

    def on_resize(self) -> None:
        self.show(self.view)

    @staticmethod
    def render_view(view: MemoryView, width: int) -> Group:
        planned_total = sum(view.planned_bytes.values())
        used_total = sum(view.used_bytes.values())
        scale = view.device_total_bytes or max(planned_total, used_total, view.budget_bytes or 0, 1)
        bars = Table.grid(padding=(0, 1))
        bars.add_column(width=8)
        bars.add_column()
        measured = bool(view.used_bytes)  # a plan alone (before the job runs) has no used row
        bars.add_row("planned", stacked_bar(view.planned_bytes, scale, width, view.budget_bytes))
        if measured:
            bars.add_row("used", stacked_bar(view.used_bytes, scale, width, view.budget_bytes))

        legend = Table(box=None, padding=(0, 1), show_edge=False, expand=False)
        legend.add_column("component")
        legend.add_column("planned", justify="right")
        if measured:
            legend.add_column("used", justify="right")
        for name in dict(_ordered({**view.planned_bytes, **view.used_bytes})):
            style = COMPONENT_STYLES.get(name, OTHER_STYLE)
            cells = [formatting.gib(view.planned_bytes.get(name), 2)] + (
                [formatting.gib(view.used_bytes.get(name), 2)] if measured else []
            )
            legend.add_row(Text("■ ", style=style) + Text(name), *cells)
        totals = [formatting.gib(planned_total, 2)] + ([formatting.gib(used_total, 2)] if measured else [])
        legend.add_row(Text("total", style="bold"), *totals)
        summary = Text.assemble(
            ("budget ", "bold"),
            f"{formatting.gib(view.budget_bytes)} {BUDGET_MARK}   ",
            ("device ", "bold"),
            formatting.used_of(view.device_used_bytes, view.device_total_bytes),
        )
        return Group(bars, Text(""), summary, Text(""), legend)
