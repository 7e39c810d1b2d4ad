"""What every full screen of the client shares: the header, the daemon banner, the footer, the job actions."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header, Static


class DaemonScreen(Screen):
    """A screen fed by the daemon; subclasses compose their body in `body()`."""

    JOB_BINDINGS = [
        Binding("p", "job('pause')", "Pause"),
        Binding("r", "job('resume')", "Resume"),
        Binding("x", "job('cancel')", "Cancel"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="banner")
        yield from self.body()
        yield Footer()

    def body(self) -> ComposeResult:
        return iter(())

    def selected_job(self) -> tuple[str, str] | None:
        """(id, name) of the job the screen's actions apply to, if any."""
        return None

    def action_job(self, action: str) -> None:
        job = self.selected_job()
        if job is None:
            self.notify("No job selected.", severity="warning")
            return
        self.app.confirm_action(action, *job)
