"""Compare: two or more jobs' reward and held-out accuracy curves on the same axes."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.widgets import Static

from tui import feeds, polling, views
from tui import messages
from tui.screens.daemon_screen import DaemonScreen
from tui.widgets import formatting
from tui.widgets.reward_chart import LineChart

REFRESH_SECONDS = 5.0  # whole histories are compared: refreshed less often than a single job's view


class CompareScreen(DaemonScreen):
    TITLE = "Compare"
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, job_ids: list[str]) -> None:
        super().__init__()
        self.job_ids = list(job_ids)

    def body(self) -> ComposeResult:
        yield Static("loading…", id="compare-legend")
        with Grid(id="compare-charts"):
            yield LineChart("reward mean", id="compare-reward")
            yield LineChart("held-out accuracy", id="compare-accuracy")

    def on_mount(self) -> None:
        self.start_polling()

    def start_polling(self) -> None:
        histories = feeds.HistoriesFeed(self.app.client, self.job_ids)
        polling.poll(self, "compare", histories.poll, REFRESH_SECONDS)

    def on_histories_loaded(self, message: messages.HistoriesLoaded) -> None:
        label = {job_id: f"{message.names[job_id]} {job_id[:4]}" for job_id in message.histories}
        self.query_one("#compare-reward", LineChart).show(
            {
                label[job_id]: views.series(records, lambda r: r.reward_mean)
                for job_id, records in message.histories.items()
            }
        )
        self.query_one("#compare-accuracy", LineChart).show(
            {label[job_id]: views.accuracy_points(records) for job_id, records in message.histories.items()}
        )
        table = Table(box=None, expand=True, padding=(0, 1))
        for column in ("job", "steps", "reward last", "reward best", "accuracy last"):
            table.add_column(column, justify="left" if column == "job" else "right")
        for job_id, records in message.histories.items():
            accuracy = views.accuracy_points(records)
            table.add_row(
                label[job_id],
                str(records[-1].step if records else 0),
                formatting.number(records[-1].reward_mean if records else None),
                formatting.number(max((r.reward_mean for r in records), default=None)),
                formatting.percent(accuracy[-1][1] if accuracy else None),
            )
        self.query_one("#compare-legend", Static).update(table)
