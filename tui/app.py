"""`appliance-tui`: the operator client of the appliance daemon (Textual).

It speaks only to the daemon's control API over its Unix socket and never
loads a model. Screens poll the daemon in Textual workers (tui.polling) and
update widgets in their message handlers; the app handles what is common to
every screen: the daemon's reachability, state-change notifications from the
events long-poll, confirmed actions and the command palette.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from collections.abc import Callable, Iterable

from rich.text import Text
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from appliance.service.client import Client, EscapedClient, default_socket
from tui import feeds, polling
from tui import messages
from tui.screens.daemon_screen import DaemonScreen
from tui.screens.confirm import ConfirmScreen
from tui.screens.device import DeviceScreen
from tui.screens.help import HelpScreen
from tui.screens.jobs import JobsScreen
from tui.screens.new_job import NewJobScreen

ACTIONS = {
    "pause": "Pause {name} ({id})? It checkpoints, then frees the device.",
    "resume": "Resume {name} ({id}) from its last checkpoint?",
    "cancel": "Cancel {name} ({id})? It stops for good; its checkpoints stay on disk.",
}
# Any call but the events long-poll (which sets its own): a daemon silent this long is reported, not awaited.
CLIENT_TIMEOUT_SECONDS = 15.0


class ApplianceApp(App):
    """Jobs, a job, compare, device, new job; every call to the daemon in a worker."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses live elsewhere
    TITLE = "appliance"
    BINDINGS = [
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("d", "device", "Device"),
        Binding("n", "new_job", "New job"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, socket_path: str | None = None, *, now: Callable[[], float] = time.time):
        super().__init__()
        self.socket_path = socket_path or default_socket()
        # Every answer escaped on its way in: no screen shows a control character the daemon sent.
        self.client = EscapedClient(Client(self.socket_path, timeout=CLIENT_TIMEOUT_SECONDS))
        self.now = now  # the clock for ages and ETAs (frozen in snapshot tests)
        self.reachable: bool | None = None
        self.unreachable_reason = ""
        self.version_problem: str | None = None
        self.poll_problems: dict[str, str] = {}  # poller group -> what its last fetch raised
        self.sub_title = self.socket_path

    def on_mount(self) -> None:
        self.start()

    def start(self) -> None:
        self.push_screen(JobsScreen())
        self.start_events()

    def on_unmount(self) -> None:
        self.client.close()

    def start_events(self) -> None:
        """Notifications of state changes, from the daemon's events long-poll."""
        events = feeds.EventsFeed(self.client)
        polling.poll(self, "events", events.poll, interval=0.0)

    # ----- the daemon's reachability ----------------------------------------------------------------

    def on_daemon_unreachable(self, message: messages.DaemonUnreachable) -> None:
        self.unreachable_reason = message.reason
        if self.reachable is not False:
            self.reachable = False
            self.show_banner()

    def on_daemon_reachable(self, _: messages.DaemonReachable) -> None:
        if self.reachable is not True:
            if self.reachable is False:
                self.notify("The daemon answers again.", title="reconnected")
            self.reachable = True
            self.show_banner()
            polling.once(self, "version", lambda: feeds.daemon_version(self.client))

    def on_daemon_version(self, message: messages.DaemonVersion) -> None:
        self.version_problem = feeds.version_problem(message)
        self.show_banner()

    def on_poll_failed(self, message: messages.PollFailed) -> None:
        self.poll_problems[message.group] = message.text
        self.show_banner()

    def on_poll_recovered(self, message: messages.PollRecovered) -> None:
        self.poll_problems.pop(message.group, None)
        self.show_banner()

    def banner_text(self) -> str:
        """The daemon's reachability, a version mismatch, and each poller that fails, one line each."""
        lines = []
        if self.reachable is False:
            lines.append(f"Daemon unreachable, retrying every {feeds.RETRY_SECONDS:.0f}s: {self.unreachable_reason}")
        if self.version_problem:
            lines.append(self.version_problem)
        live = {poller.group for screen in self.screen_stack for poller in screen.query(polling.Poller)}
        for group in [group for group in self.poll_problems if group not in live]:
            del self.poll_problems[group]  # its screen is gone
        lines += [f"{group} failed, retrying: {text}" for group, text in self.poll_problems.items()]
        return "\n".join(lines)

    def show_banner(self) -> None:
        text = Text(self.banner_text())  # the daemon's words: never read as markup
        self.set_class(bool(text.plain), "-banner")
        for screen in self.screen_stack:
            for banner in screen.query("#banner"):
                banner.update(text)

    def on_screen_resume(self) -> None:
        self.show_banner()

    # ----- notifications ---------------------------------------------------------------------------

    def on_job_changed(self, message: messages.JobChanged) -> None:
        severity = "error" if message.state == "failed" else "information"
        reason = f": {message.reason}" if message.reason else ""
        self.notify(f"{message.name} ({message.job_id}) is {message.state}{reason}", severity=severity, markup=False)

    def on_action_done(self, message: messages.ActionDone) -> None:
        self.notify(message.text, title=message.action, markup=False)

    def on_action_failed(self, message: messages.ActionFailed) -> None:
        self.notify(message.text, title=f"{message.action} failed", severity="error", markup=False)

    # ----- actions ------------------------------------------------------------------------------------

    def confirm_action(self, action: str, job_id: str, name: str) -> None:
        """Ask in a modal, then pause / resume / cancel the job in a worker."""

        def answered(yes: bool | None) -> None:
            if yes:
                polling.once(self, f"action-{job_id}", lambda: feeds.act(self.client, action, job_id))

        question = ACTIONS[action].format(name=name, id=job_id)
        self.push_screen(ConfirmScreen(question, action), answered)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.screen))

    def action_device(self) -> None:
        if not isinstance(self.screen, DeviceScreen):
            self.push_screen(DeviceScreen())

    def action_new_job(self) -> None:
        if not isinstance(self.screen, NewJobScreen):
            self.push_screen(NewJobScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette offers every action the keys do, for the job under the cursor or on screen."""
        yield from super().get_system_commands(screen)
        job = screen.selected_job() if isinstance(screen, DaemonScreen) else None
        if job is not None:
            job_id, name = job
            for action in ACTIONS:
                yield SystemCommand(
                    f"{action.capitalize()} {name}",
                    f"{action} job {job_id}",
                    lambda a=action: self.confirm_action(a, job_id, name),
                )
        yield SystemCommand("Device", "memory per component against the budget", self.action_device)
        yield SystemCommand("New job", "edit, validate and submit a job file", self.action_new_job)
        yield SystemCommand("Keys", "every key of this screen", self.action_help)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="appliance-tui", description="Operator client for the appliance daemon.")
    parser.add_argument(
        "--socket",
        default=None,
        help="the daemon's control socket (default: $APPLIANCE_SOCKET, else /run/appliance/control.sock)",
    )
    args = parser.parse_args(argv)
    ApplianceApp(args.socket).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
