"""New job: pick an example or a path, edit the YAML, validate (the daemon's dry run), submit."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Input, Select, Static, TextArea

from tui import feeds, polling, views
from tui import messages
from tui.screens.daemon_screen import DaemonScreen
from tui.screens.job import render_plan
from tui.widgets.memory_bar import MemoryBar


def example_folders() -> list[Path]:
    """./examples and the source tree's examples/ (a checkout or the image's copy)."""
    return [Path.cwd() / "examples", Path(__file__).resolve().parents[2] / "examples"]


class NewJobScreen(DaemonScreen):
    TITLE = "New job"
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        # priority: they work while the editor has focus (ctrl+v stays the editor's paste).
        Binding("ctrl+t", "validate", "Validate", priority=True),
        Binding("ctrl+s", "submit", "Submit", priority=True),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.file_name = "job.yaml"  # what the daemon's errors name until a file is loaded

    def body(self) -> ComposeResult:
        with Horizontal(id="new-source"):
            yield Select([], prompt="an example", id="example")
            yield Input(placeholder="or a path to a job file, then enter", id="path")
        with Horizontal(id="new-main"):
            yield TextArea("", id="editor", show_line_numbers=True, soft_wrap=False, tab_behavior="indent")
            with VerticalScroll(id="new-result-box"):
                yield Static(
                    "Validate (ctrl+t) asks the daemon for every error or the memory plan; "
                    "Submit (ctrl+s) queues the job.",
                    id="new-result",
                )
                yield MemoryBar(id="new-plan-bar")
        with Horizontal(id="new-buttons"):
            yield Button("Validate", id="validate")
            yield Button("Submit", variant="success", id="submit")

    def on_mount(self) -> None:
        folders = example_folders()
        polling.once(self, "examples", lambda: feeds.example_files(folders))

    def on_examples_found(self, message: messages.ExamplesFound) -> None:
        select = self.query_one("#example", Select)
        with select.prevent(Select.Changed):
            select.set_options([(path.name, str(path)) for path in message.paths])

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.value is not Select.BLANK:
            self.load(Path(str(event.value)))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.load(Path(event.value).expanduser())

    def load(self, path: Path) -> None:
        """Read the file in a worker; on_job_file_read puts it in the editor."""
        polling.once(self, "read", lambda: feeds.read_job_file(path))

    def on_job_file_read(self, message: messages.JobFileRead) -> None:
        if message.text is None:
            self.show_result(message.problem or "")
            return
        self.file_name = str(message.path)
        self.query_one("#editor", TextArea).load_text(message.text)

    def show_result(self, text: str) -> None:
        """The daemon's sentences, shown as plain text (never read as markup)."""
        self.query_one("#new-result", Static).update(Text(text))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "validate":
            self.action_validate()
        elif event.button.id == "submit":
            self.action_submit()

    def send(self, dry_run: bool) -> None:
        text = self.query_one("#editor", TextArea).text
        if not text.strip():
            self.show_result("The job file is empty: pick an example or a path.")
            return
        client, name = self.app.client, self.file_name
        polling.once(self, "submit", lambda: feeds.submit(client, name, text, dry_run))

    def action_validate(self) -> None:
        self.send(dry_run=True)

    def action_submit(self) -> None:
        self.send(dry_run=False)

    def on_validated(self, message: messages.Validated) -> None:
        result = self.query_one("#new-result", Static)
        if message.ok:
            result.update(render_plan(message.plan))
        else:
            result.update(Text("\n".join(message.errors)))
        if message.plan:
            self.query_one("#new-plan-bar", MemoryBar).show(views.plan_memory_view(message.plan))

    def on_action_done(self, message: messages.ActionDone) -> None:
        if message.action == "submit":
            self.show_result(message.text)

    def on_action_failed(self, message: messages.ActionFailed) -> None:
        if message.action == "submit":
            self.show_result(message.text)
