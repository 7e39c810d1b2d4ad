"""The TUI against a real daemon that says hostile or unexpected things: it shows them and keeps going.

Daemon text with Rich markup in it is shown literally; a poller whose fetch
raises (a KeyError here, injected into the jobs feed) shows a banner and keeps
polling until it recovers; a daemon of another API version is named as such.
"""

from __future__ import annotations

import re

import pytest
from tui_support import screen_text, until, widget_text

from appliance.service.api import API_VERSION
from tui import feeds
from tui.app import ApplianceApp
from tui.screens.jobs import JobsScreen
from tui.screens.new_job import NewJobScreen

MARKUP = "[/x][bold]oops[/bold]"


async def reach(pilot) -> None:
    await until(
        pilot,
        lambda: pilot.app.reachable is True and isinstance(pilot.app.screen, JobsScreen),
        "the jobs screen reaching the daemon",
        30,
    )


def unwrapped(app, selector: str) -> str:
    """One widget's text on screen with its lines joined: the panel wraps the long error path wherever its
    width falls (the test's tmp path differs by machine), and MARKUP itself holds no space."""
    return "".join(line.strip() for line in widget_text(app, selector).splitlines())


def result_text(app) -> str:
    """The new job screen's result panel as plain text (before it wraps)."""
    return str(app.screen.query_one("#new-result").content)


@pytest.mark.anyio
async def test_daemon_errors_with_markup_are_shown_literally(bare_daemon, tmp_path):
    job_file = tmp_path / f"{MARKUP}.yaml"  # the daemon's errors name the file (folders "[" and "x][bold]oops[")
    job_file.parent.mkdir(parents=True)
    job_file.write_text("name: [unclosed\n", encoding="utf-8")
    app = ApplianceApp(str(bare_daemon.socket_path))
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await reach(pilot)
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewJobScreen), "the new job screen", 10)
        app.screen.load(job_file)
        await until(pilot, lambda: "[unclosed" in app.screen.query_one("#editor").text, "the file in the editor", 10)

        await pilot.press("ctrl+t")  # the dry run's errors
        await until(pilot, lambda: MARKUP in unwrapped(app, "#new-result"), "the refusal shown literally", 30)
        await pilot.press("ctrl+s")  # the submit's refusal: the same errors, in a notification too
        await until(pilot, lambda: "submit failed" in screen_text(app), "the refusal's notification", 30)
        toast = screen_text(app).split("submit failed", 1)[1]
        # The toast wraps the path wherever its width falls: read it with the wrap and the borders taken out.
        assert "oops[/bold]" in re.sub(r"[\s▊▎▌▁▔]", "", toast)
        app.screen.load(tmp_path / "missing" / f"{MARKUP}.yaml")  # a local error with markup too
        await until(
            pilot,
            lambda: f"cannot read {tmp_path}/missing/{MARKUP}" in result_text(app),
            "the read error shown literally",
            10,
        )
        await pilot.pause(0.3)  # rendered without a markup error
        assert app.is_running and "[/x]" in screen_text(app)


@pytest.mark.anyio
async def test_unreachable_reason_with_markup_is_shown_literally(tmp_path):
    socket = tmp_path / "[bold]" / "[x].sock"
    app = ApplianceApp(str(socket))
    async with app.run_test(size=(160, 24)) as pilot:
        await until(pilot, lambda: "Daemon unreachable" in screen_text(app), "the unreachable banner", 15)
        assert "[bold]/[x].sock" in widget_text(app, "#banner")


@pytest.mark.anyio
async def test_a_poller_that_raises_shows_a_banner_and_keeps_polling(bare_daemon, monkeypatch):
    calls = {"failed": 0}
    real_poll = feeds.JobsFeed.poll

    def broken(self):
        if calls["failed"] < 3:
            calls["failed"] += 1
            raise KeyError("slots")  # an answer this client does not understand
        return real_poll(self)

    monkeypatch.setattr(feeds.JobsFeed, "poll", broken)
    app = ApplianceApp(str(bare_daemon.socket_path))
    async with app.run_test(size=(120, 30)) as pilot:
        await until(
            pilot, lambda: "jobs failed, retrying: KeyError: 'slots'" in screen_text(app), "the poller's banner", 15
        )
        await until(pilot, lambda: calls["failed"] >= 2, "the poller trying again after the error", 15)
        await until(
            pilot,
            lambda: "no jobs yet" in screen_text(app) and "failed" not in screen_text(app),
            "the poller recovering and the banner going",
            20,
        )
        assert calls["failed"] == 3


@pytest.mark.anyio
async def test_a_daemon_of_another_api_version_is_named(bare_daemon, monkeypatch):
    monkeypatch.setattr(feeds, "API_VERSION", API_VERSION + 1)  # this client was built for the next API
    app = ApplianceApp(str(bare_daemon.socket_path))
    async with app.run_test(size=(160, 30)) as pilot:
        await reach(pilot)
        await until(pilot, lambda: "Version mismatch" in screen_text(app), "the version banner", 15)
        banner = widget_text(app, "#banner")
        assert f"this client speaks API v{API_VERSION + 1}" in banner
        assert f"speaks API v{API_VERSION}" in banner and "0.1.0" in banner
