"""One job: overview charts, samples, judge log, log tail and config, in tabs."""

from __future__ import annotations

import yaml
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.widgets import RichLog, Select, Static, TabbedContent, TabPane, TextArea

from appliance.service.api import PHASES, JobDetail, JsonObject, StepRecord
from appliance.service.samples import is_trajectory, parse_trajectory
from tui import feeds, polling, views
from tui import messages
from tui.screens.daemon_screen import DaemonScreen
from tui.widgets import formatting
from tui.widgets.memory_bar import MemoryBar
from tui.widgets.reward_chart import LineChart
from tui.widgets.trajectory_view import render_trajectory

LOG_SECONDS = 1.0
LOG_MAX_LINES = 2000  # the view keeps the newest lines; the whole log is on disk and in `appliance jobs logs`
OUTCOMES = ("ok", "parse_error", "timeout")
TABS = ("overview", "samples", "judge", "logs", "config")


class JobScreen(DaemonScreen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        *DaemonScreen.JOB_BINDINGS,
        Binding("g", "reload_tab", "Reload tab"),
        *[
            Binding(str(number), f"tab('{tab}')", tab.capitalize(), show=False)
            for number, tab in enumerate(TABS, start=1)
        ],
    ]

    def __init__(self, job_id: str, name: str) -> None:
        super().__init__()
        self.job_id = job_id
        self.job_name = name
        self.title = f"{name} ({job_id})"
        self.job: JobDetail | None = None
        self.records: list[StepRecord] = []
        self.sample_step: int | None = None
        self.judge_outcome: str | None = None

    def body(self) -> ComposeResult:
        yield Static("", id="job-head")
        with TabbedContent(initial="overview"):
            with TabPane("Overview", id="overview"):
                with VerticalScroll():
                    yield Static("", id="job-stats")
                    with Grid(id="charts"):
                        yield LineChart("reward", id="chart-reward")
                        yield LineChart("held-out accuracy", id="chart-accuracy")
                        yield LineChart("KL", id="chart-kl")
                        yield LineChart("loss", id="chart-loss")
                        yield LineChart("completion length", id="chart-length")
                        yield LineChart("student tokens/s", id="chart-tps")
            with TabPane("Samples", id="samples"):
                yield Select([], prompt="step", id="sample-step", allow_blank=True)
                with VerticalScroll():
                    yield Static("no samples yet", id="sample-list")
            with TabPane("Judge", id="judge"):
                yield Select(
                    [(outcome, outcome) for outcome in OUTCOMES],
                    prompt="every outcome",
                    id="judge-outcome",
                    allow_blank=True,
                )
                with VerticalScroll():
                    yield Static("no judge calls", id="judge-list")
            with TabPane("Logs", id="logs"):
                yield RichLog(max_lines=LOG_MAX_LINES, id="log", wrap=True)
            with TabPane("Config", id="config"):
                with Horizontal():
                    yield TextArea("", read_only=True, id="spec")
                    with VerticalScroll(id="plan-box"):
                        yield MemoryBar(id="plan-bar")
                        yield Static("", id="plan")

    def on_mount(self) -> None:
        self.start_polling()

    def start_polling(self) -> None:
        detail = feeds.JobFeed(self.app.client, self.job_id)
        polling.poll(self, "job-detail", detail.poll, interval=0.0)  # paced by the events long-poll
        log = feeds.LogFeed(self.app.client, self.job_id)
        polling.poll(self, "job-log", log.poll, LOG_SECONDS)

    def selected_job(self) -> tuple[str, str] | None:
        return self.job_id, self.job_name

    # ----- data in -----------------------------------------------------------------------------------

    def on_job_loaded(self, message: messages.JobLoaded) -> None:
        first = self.job is None
        self.job = message.job
        self.show_head()
        if first:
            self.show_config()

    def on_steps_arrived(self, message: messages.StepsArrived) -> None:
        if not message.records and self.records:
            return
        known = {record.step for record in self.records}
        self.records += [record for record in message.records if record.step not in known]
        self.show_head()
        self.show_overview()

    def on_log_loaded(self, message: messages.LogLoaded) -> None:
        log = self.query_one("#log", RichLog)
        if message.reset:
            log.clear()
        for line in message.lines:
            log.write(line)

    def on_samples_loaded(self, message: messages.SamplesLoaded) -> None:
        self.sample_step = message.step
        select = self.query_one("#sample-step", Select)
        with select.prevent(Select.Changed):
            select.set_options([(f"step {step}", step) for step in reversed(message.steps)])
            if message.step is not None:
                select.value = message.step
        self.query_one("#sample-list", Static).update(
            render_samples(message.samples) if message.samples else "no samples yet"
        )

    def on_judge_loaded(self, message: messages.JudgeLoaded) -> None:
        self.query_one("#judge-list", Static).update(
            render_judge(message.entries)
            if message.entries
            else "no judge calls" + (f" with outcome {message.outcome}" if message.outcome else "")
        )

    # ----- tabs that load on demand ------------------------------------------------------------------

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.load_tab(event.pane.id)

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_reload_tab(self) -> None:
        self.load_tab(self.query_one(TabbedContent).active)

    def load_tab(self, tab: str | None) -> None:
        client = self.app.client
        if tab == "samples":
            step = self.sample_step
            polling.once(self, "job-samples", lambda: feeds.samples(client, self.job_id, step))
        elif tab == "judge":
            outcome = self.judge_outcome
            polling.once(self, "job-judge", lambda: feeds.judge(client, self.job_id, outcome))

    def on_select_changed(self, event: Select.Changed) -> None:
        value = None if event.value is Select.BLANK else event.value
        if event.select.id == "sample-step":
            self.sample_step = value
            self.load_tab("samples")
        elif event.select.id == "judge-outcome":
            self.judge_outcome = value
            self.load_tab("judge")

    # ----- rendering ---------------------------------------------------------------------------------

    def show_head(self) -> None:
        job = self.job
        if job is None:
            return
        pace = views.seconds_per_step(self.records)
        left = None if feeds.is_final(job.state) else formatting.eta(job.step, job.steps_total, pace)
        head = Text.assemble(
            (f"{job.name} ", "bold"),
            f"({job.id}) ",
            (job.state, "bold"),
            f"  step {job.step}/{job.steps_total} {formatting.progress_bar(job.step, job.steps_total, 10)}",
            f"  {formatting.duration(pace)}/step  ETA {formatting.duration(left)}",
            f"  phase {job.phase}" if job.phase else "",
        )
        if job.reason:
            head.append(f"\n{job.reason}", style="italic")
        self.query_one("#job-head", Static).update(head)

    def show_overview(self) -> None:
        records = self.records
        self.query_one("#chart-reward", LineChart).show(views.reward_series(records))
        self.query_one("#chart-accuracy", LineChart).show({"accuracy": views.accuracy_points(records)})
        self.query_one("#chart-kl", LineChart).show({"kl": views.series(records, lambda r: r.kl)})
        self.query_one("#chart-loss", LineChart).show({"loss": views.series(records, lambda r: r.loss)})
        self.query_one("#chart-length", LineChart).show(
            {"length": views.series(records, lambda r: r.completion_length_mean)}
        )
        self.query_one("#chart-tps", LineChart).show(
            {"tokens/s": views.series(records, lambda r: r.student_tokens_per_second)}
        )
        self.query_one("#job-stats", Static).update(render_stats(records, self.job))

    def show_config(self) -> None:
        job = self.job
        self.query_one("#spec", TextArea).load_text(yaml.safe_dump(job.spec, sort_keys=False))
        if job.plan:
            self.query_one("#plan-bar", MemoryBar).show(views.plan_memory_view(job.plan))
            self.query_one("#plan", Static).update(render_plan(job.plan))


def render_stats(records: list[StepRecord], job: JobDetail | None) -> Table:
    """The last step's numbers, rewards per function, phase seconds and checkpoints."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    if not records:
        table.add_row("steps", "none recorded yet")
        return table
    last = records[-1]
    table.add_row(
        "reward",
        Text(  # reward names are the job file's (plugin paths): plain text, never markup
            f"{formatting.number(last.reward_mean)} ± {formatting.number(last.reward_std)}  "
            + "  ".join(f"{name} {formatting.number(stats.mean)}" for name, stats in sorted(last.rewards.items()))
        ),
    )
    evaluated = [record.eval for record in records if record.eval is not None]
    if evaluated:
        table.add_row(
            "held-out",
            f"accuracy {formatting.percent(evaluated[-1].accuracy)}  format "
            f"{formatting.percent(evaluated[-1].format_compliance)}  ({evaluated[-1].problems} problems)",
        )
    table.add_row(
        "train",
        f"loss {formatting.number(last.loss, 4)}  KL {formatting.number(last.kl, 4)}  "
        f"clip {formatting.percent(last.clip_ratio)}  length {last.completion_length_mean:.1f} tok  "
        f"{formatting.rate(last.student_tokens_per_second)} tok/s",
    )
    phases = [(phase, last.seconds[phase]) for phase in PHASES if last.seconds.get(phase)]
    table.add_row(
        "seconds",
        "  ".join(f"{phase} {seconds:.1f}" for phase, seconds in phases)
        + f"  (step {last.seconds.get('step', 0.0):.1f})",
    )
    if job is not None and job.checkpoints:
        best_step = (job.best or {}).get("step")
        table.add_row(
            "checkpoints",
            "  ".join(f"{c.step}{'★' if c.step == best_step else ''}" for c in job.checkpoints)
            + ("  ★ best" if best_step is not None else ""),
        )
    return table


def render_samples(samples: list[JsonObject]) -> RenderableType:
    """Each prompt with its group of completions (reward per function, advantage), or each scenario with its
    group of agent trajectories (turns, tool calls, the trained mask)."""
    grouped = views.group_samples(samples)
    trajectories = [
        (step, number, group)
        for step, groups in grouped.items()
        for number, group in enumerate(groups, start=1)
        if is_trajectory(group[0])
    ]
    if not trajectories:
        return render_completions(grouped)
    parts: list[RenderableType] = []
    for step, number, group in trajectories:
        first = parse_trajectory(group[0])
        parts.append(
            Rule(
                f"step {step} · group {number} · {first.environment} · {len(group)} trajectories",
                align="left",
                style="dim",
            )
        )
        parts += [render_trajectory(parse_trajectory(record), index) for index, record in enumerate(group, start=1)]
    singles = {step: [group for group in groups if not is_trajectory(group[0])] for step, groups in grouped.items()}
    if any(singles.values()):
        parts.append(render_completions(singles))
    return Group(*parts)


def render_completions(grouped: dict[int, list[list[dict]]]) -> Table:
    table = Table(box=None, expand=True, show_header=True, padding=(0, 1))
    table.add_column("#", justify="right", width=2)
    table.add_column("completion", ratio=1)
    table.add_column("reward / advantage", ratio=1)
    for step, groups in grouped.items():
        for number, group in enumerate(groups, start=1):
            first = group[0]
            table.add_row(
                "",
                Text.assemble(
                    (f"step {step} · prompt {number}: ", "bold"),
                    str(first.get("question", "")),
                    (f"  (answer {first.get('reference', '')})", "italic"),
                ),
                "",
            )
            for index, sample in enumerate(group, start=1):
                rewards = "  ".join(
                    f"{name} {formatting.number(value, 2)}"
                    for name, value in sorted((sample.get("rewards") or {}).items())
                )
                table.add_row(
                    str(index),
                    Text(str(sample.get("completion", "")).strip()),
                    Text(
                        f"{formatting.number(sample.get('reward'), 2)}  {rewards}\n"
                        f"advantage {formatting.number(sample.get('advantage'), 2)}"
                    ),
                )
    return table


def render_judge(entries: list[JsonObject]) -> Table:
    table = Table(box=None, expand=True, padding=(0, 1))
    table.add_column("step", justify="right", width=4)
    table.add_column("outcome", width=11)
    table.add_column("scores", width=12)
    table.add_column("raw output", ratio=1)
    for entry in entries:
        scores = entry.get("scores") or []
        table.add_row(
            Text(str(entry.get("step", ""))),
            Text(str(entry.get("outcome", ""))),
            Text(" ".join(formatting.number(s, 2) for s in scores) if isinstance(scores, list) else str(scores)),
            Text(str(entry.get("raw_output", "")).strip()),
        )
        if entry.get("errors"):
            table.add_row("", "", "", Text("; ".join(map(str, entry["errors"])), style="red"))
    return table


def render_plan(plan: JsonObject) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    engines = plan.get("engines") or {}
    choices = plan.get("choices") or {}
    table.add_row("fits", "yes" if plan.get("fits") else "no")
    table.add_row(
        "peak", f"{formatting.gib(plan.get('peak_bytes'), 2)} of {formatting.gib(plan.get('budget_bytes'), 2)} budget"
    )
    table.add_row("engines", Text(", ".join(f"{role} {name}" for role, name in engines.items() if name)))
    for key in ("time_share", "micro_batch_size", "gradient_checkpointing", "rollout_weights"):
        if key in choices:
            table.add_row(key.replace("_", " "), Text(str(choices[key])))
    return table
