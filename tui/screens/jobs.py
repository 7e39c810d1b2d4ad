"""The jobs screen: every job the daemon knows, live; filter by state, sort, mark jobs to compare."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from appliance.service.api import JOB_STATES, JobSummary, StepRecord
from tui import feeds, polling, views
from tui import messages
from tui.screens.daemon_screen import DaemonScreen
from tui.screens.compare import CompareScreen
from tui.screens.job import JobScreen
from tui.widgets.job_table import SORTS, JobTable, sort_rows

FILTERS = ("all",) + JOB_STATES


class JobsScreen(DaemonScreen):
    TITLE = "Jobs"
    BINDINGS = [
        Binding("enter", "open", "Open", show=False),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("f", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        *DaemonScreen.JOB_BINDINGS,
    ]

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[JobSummary] = []
        self.records: dict[str, list[StepRecord]] = {}
        self.budgets: dict[str, int | None] = {}
        self.marked: set[str] = set()
        self.filter = "all"
        self.sort = SORTS[0]
        self.loaded = False

    def body(self) -> ComposeResult:
        yield Static("", id="jobs-info")
        yield JobTable(id="jobs")

    def on_mount(self) -> None:
        self.show_info()
        self.start_polling()

    def start_polling(self) -> None:
        jobs = feeds.JobsFeed(self.app.client)
        polling.poll(self, "jobs", jobs.poll, interval=0.0)  # paced by the events long-poll

    def on_jobs_loaded(self, message: messages.JobsLoaded) -> None:
        self.jobs = message.jobs
        self.records = message.records
        self.budgets = message.budgets
        self.loaded = True
        self.render_jobs()

    def render_jobs(self) -> None:
        shown = [job for job in self.jobs if self.filter in ("all", job.state)]
        rows = [
            views.job_row(job, self.records.get(job.id, []), self.budgets.get(job.id), job.id in self.marked)
            for job in shown
        ]
        self.query_one(JobTable).show(sort_rows(rows, self.sort), self.app.now())
        self.show_info(len(shown))

    def show_info(self, shown: int | None = None) -> None:
        if not self.loaded:
            text = "waiting for the daemon…"
        elif not self.jobs:
            text = "no jobs yet — n: new job"
        else:
            text = (
                f"{shown}/{len(self.jobs)} jobs · filter: {self.filter} (f) · sort: {self.sort} (s)"
                f" · marked: {len(self.marked)} (space; c compares)"
            )
        self.query_one("#jobs-info", Static).update(text)

    def selected_job(self) -> tuple[str, str] | None:
        job_id = self.query_one(JobTable).selected_id
        for job in self.jobs:
            if job.id == job_id:
                return job.id, job.name
        return None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        job = self.selected_job()
        if job is not None:
            self.app.push_screen(JobScreen(*job))

    def action_mark(self) -> None:
        job = self.selected_job()
        if job is not None:
            self.marked ^= {job[0]}
            self.render_jobs()

    def action_compare(self) -> None:
        chosen = [job.id for job in self.jobs if job.id in self.marked]
        if len(chosen) < 2:
            self.notify("Mark two or more jobs with space first.", severity="warning")
            return
        self.app.push_screen(CompareScreen(chosen))

    def action_filter(self) -> None:
        self.filter = FILTERS[(FILTERS.index(self.filter) + 1) % len(FILTERS)]
        self.render_jobs()

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.render_jobs()
