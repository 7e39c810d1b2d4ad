"""Line charts over steps (textual-plotext): one or more named series on shared axes.

Used for the job screen's reward, accuracy, KL, loss, length and tokens/s
charts and for the compare screen's overlays. Formatting only: the screen
hands over the points; the chart keeps them (`series`) and redraws.
"""

from __future__ import annotations

from textual_plotext import PlotextPlot

Points = list[tuple[int, float]]


class LineChart(PlotextPlot):
    """A titled line chart; `show()` replaces every series at once."""

    def __init__(self, title: str, *, y_label: str = "", id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.title = title
        self.y_label = y_label
        self.series: dict[str, Points] = {}

    def on_mount(self) -> None:
        super().on_mount()
        self._draw()

    def show(self, series: dict[str, Points]) -> None:
        self.series = {name: list(points) for name, points in series.items()}
        self._draw()

    @property
    def point_count(self) -> int:
        return sum(len(points) for points in self.series.values())

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel("step")
        if self.y_label:
            plt.ylabel(self.y_label)
        drawn = False
        several = len(self.series) > 1
        for name, points in self.series.items():
            if not points:
                continue
            steps = [step for step, _ in points]
            values = [value for _, value in points]
            # One point draws no line: mark it so the first step is visible.
            marker = "hd" if len(points) > 1 else "dot"
            plt.plot(steps, values, marker=marker, label=name if several else None)
            drawn = True
        if drawn:
            plt.xticks(step_ticks([step for points in self.series.values() for step, _ in points]))
        else:
            plt.xticks([])
            plt.yticks([])
        self.refresh()


def step_ticks(steps: list[int], most: int = 5) -> list[int]:
    """Up to `most` whole-number ticks from the first step to the last (plotext would pick fractions)."""
    low, high = min(steps), max(steps)
    if high - low < most:
        return list(range(low, high + 1))
    stride = -(-(high - low) // (most - 1))
    ticks = list(range(low, high, stride))
    # The last step is always a tick; it replaces the one before when the two would crowd each other.
    return ticks + [high] if high - ticks[-1] >= stride / 2 else ticks[:-1] + [high]
