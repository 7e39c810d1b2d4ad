"""The TUI driven with Pilot against a real daemon (temporary socket and data dir, the bundled model, a tiny job).

One job goes through the whole operator path: submitted from the New job
screen, seen on the jobs screen as it changes state, opened (charts receive
points, a sample's completions show), then paused, resumed and cancelled
through the confirmation modals, each checked in the daemon itself. A second
test stops the daemon under the app and starts it again.
"""

from __future__ import annotations

import stat

import pytest
from daemon_support import tiny_job
from tui_support import in_thread, screen_text, until, widget_text

from appliance.service.client import Client
from tui import messages
from tui.app import ApplianceApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.job import JobScreen
from tui.screens.jobs import JobsScreen
from tui.screens.new_job import NewJobScreen
from tui.widgets.job_table import JobTable
from tui.widgets.reward_chart import LineChart

# Generous: a loaded 2-core box takes tens of seconds per tiny step; an idle one a few.
STEP_WAIT = 420.0
STATE_WAIT = 180.0


def table_state(app, job_id: str) -> str | None:
    """The state the jobs table shows for a job (None when the job is not listed)."""
    table = app.screen_stack[1].query_one(JobTable)  # the jobs screen, whatever is on top of it
    if job_id not in {row.id for row in table.rows_shown}:
        return None
    return next(row.state for row in table.rows_shown if row.id == job_id)


async def confirm(pilot, key: str) -> None:
    await pilot.press(key)
    await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), f"the {key!r} confirmation", 10)
    await pilot.press("y")


@pytest.mark.anyio
@pytest.mark.model
async def test_operator_path_against_a_real_daemon(daemon):
    client = Client(daemon.socket_path)
    app = ApplianceApp(str(daemon.socket_path))
    seen_states: list[str] = []
    seconds: dict[str, float] = {}  # what each wait took, printed for the record
    changes: list[messages.JobChanged] = []

    def record(message) -> None:
        if isinstance(message, messages.JobChanged):
            changes.append(message)

    async with app.run_test(size=(120, 40), notifications=True, message_hook=record) as pilot:
        await until(
            pilot,
            lambda: app.reachable is True and isinstance(app.screen, JobsScreen) and "no jobs yet" in screen_text(app),
            "the jobs screen reaching the daemon and listing no jobs",
            30,
        )

        # New job: validate (the daemon's dry run shows the plan), then submit.
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewJobScreen), "the new job screen", 10)
        app.screen.query_one("#editor").load_text(tiny_job("tui-pilot", steps=40))
        await pilot.press("ctrl+t")
        await until(
            pilot, lambda: "fits" in screen_text(app) and "budget" in screen_text(app), "the dry run's memory plan", 60
        )
        assert not await in_thread(client.jobs), "a dry run queued a job"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "submitted tui-pilot" in screen_text(app), "the submit confirmation", 60)
        [job] = await in_thread(client.jobs)
        job_dir = daemon.data_dir / "jobs" / job.id  # owner/group-only state
        assert (stat.S_IMODE(job_dir.stat().st_mode), stat.S_IMODE((job_dir / "job.yaml").stat().st_mode)) == (
            0o750,
            0o640,
        )
        await pilot.press("escape")

        # The jobs screen lists it by name and follows its state.
        def listed_state() -> str | None:
            state = table_state(app, job.id)
            if state is not None and (not seen_states or seen_states[-1] != state):
                seen_states.append(state)
            return state

        seconds["listed after submit"] = await until(
            pilot, lambda: listed_state() is not None and "tui-pilot" in screen_text(app), "the job listed by name", 30
        )
        seconds["shown running"] = await until(
            pilot, lambda: listed_state() == "running", "the job shown running", STATE_WAIT
        )

        # The job screen: charts receive points, a sample's completions are visible.
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobScreen), "the job screen", 10)
        chart = app.screen.query_one("#chart-reward", LineChart)
        seconds["first chart point"] = await until(
            pilot, lambda: chart.point_count >= 1, "a reward point on the chart", STEP_WAIT
        )
        assert app.screen.query_one("#chart-tps", LineChart).point_count >= 1
        await pilot.click("#--content-tab-samples")
        screen = app.screen
        seconds["samples loaded"] = await until(
            pilot, lambda: screen.sample_step is not None, "the samples tab choosing a step", 30
        )
        # The step the tab shows (the newest when it loaded; later steps may have finished since) as the daemon has it.
        samples = [r for r in (await in_thread(client.samples, job.id, 400)).records if r["step"] == screen.sample_step]
        line = next(line.strip() for record in samples for line in record["completion"].splitlines() if line.strip())
        seconds["sample shown"] = await until(
            pilot, lambda: line[:12] in screen_text(app), f"step {screen.sample_step}'s completion {line[:12]!r}", 30
        )
        # Logs: the tail of log.txt, as the daemon serves it.
        await pilot.press("4")
        assert "job 'tui-pilot' in" in (await in_thread(client.log, job.id)).text
        seconds["log shown"] = await until(
            pilot, lambda: "job 'tui-pilot' in" in widget_text(app, "#log"), "the run's first log line on screen", 30
        )
        await pilot.press("1")

        # Pause, resume, cancel through the modals; each lands in the daemon and on screen.
        await confirm(pilot, "p")
        seconds["paused in the daemon"] = await until(
            pilot, lambda: client.job(job.id).state == "paused", "the daemon pausing the job", STATE_WAIT
        )
        seconds["then on screen"] = await until(
            pilot, lambda: " paused " in widget_text(app, "#job-head"), "the job screen showing paused", 10
        )
        await until(
            pilot, lambda: f"{job.name} ({job.id}) is paused" in screen_text(app), "the notification of the pause", 10
        )
        await confirm(pilot, "r")
        seconds["resumed in the daemon"] = await until(
            pilot, lambda: client.job(job.id).state in ("queued", "running"), "the daemon resuming the job", STATE_WAIT
        )
        await until(
            pilot,
            lambda: any(f" {state} " in widget_text(app, "#job-head") for state in ("queued", "running")),
            "the job screen showing the job resumed",
            10,
        )
        await confirm(pilot, "x")
        seconds["cancelled in the daemon"] = await until(
            pilot, lambda: client.job(job.id).state == "cancelled", "the daemon cancelling the job", 60
        )
        await until(
            pilot, lambda: " cancelled " in widget_text(app, "#job-head"), "the job screen showing cancelled", 10
        )

        await pilot.press("escape")
        await until(pilot, lambda: listed_state() == "cancelled", "the jobs table showing cancelled", 10)
    client.close()
    print("seconds: " + ", ".join(f"{what} {value:.1f}" for what, value in seconds.items()))
    # What the jobs table showed while it was on top: the job changing state, ending cancelled.
    assert seen_states[0] in ("queued", "running") and "running" in seen_states, seen_states
    assert seen_states[-1] == "cancelled", seen_states
    # The events long-poll reported each change (the notifications' source).
    assert [c.state for c in changes if c.job_id == job.id][-1] == "cancelled"
    assert {"running", "paused", "cancelled"} <= {c.state for c in changes if c.job_id == job.id}


@pytest.mark.anyio
async def test_unreachable_daemon_is_shown_and_recovered(bare_daemon):
    daemon = bare_daemon
    app = ApplianceApp(str(daemon.socket_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot,
            lambda: app.reachable is True and "no jobs yet" in screen_text(app),
            "the jobs screen reaching the daemon",
            30,
        )
        assert "unreachable" not in screen_text(app)

        await in_thread(daemon.stop)
        await until(pilot, lambda: "Daemon unreachable" in screen_text(app), "the unreachable banner", 15)

        await in_thread(daemon.start)
        seconds = await until(
            pilot,
            lambda: app.reachable is True and "unreachable" not in screen_text(app),
            "the app reconnecting by itself",
            15,
        )
        assert "no jobs yet" in screen_text(app)
        print(f"reconnected {seconds:.1f}s after the daemon answered again")
