"""New job: pick an example or a path, edit the YAML, validate (the daemon's dry run), submit."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Input, Select, Static, TextArea

from tui import feeds, polling, views
from tui import messages as m
from tui.screens.base import DaemonScreen
from tui.screens.job import render_plan
from tui.widgets.memory_bar import MemoryBar


def example_files() -> list[Path]:
    """Job files in ./examples and in the source tree's examples/ (a checkout or the image's copy)."""
    folders = [Path.cwd() / "examples", Path(__file__).resolve().parents[2] / "examples"]
    found: dict[str, Path] = {}
    for folder in folders:
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                found.setdefault(path.name, path)
    return list(found.values())


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
        examples = example_files()
        with Horizontal(id="new-source"):
            yield Select([(path.name, str(path)) for path in examples], prompt="an example", id="example")
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

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.value is not Select.BLANK:
            self.load(Path(str(event.value)))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.load(Path(event.value).expanduser())

    def load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            self.query_one("#new-result", Static).update(f"cannot read {path}: {error}")
            return
        self.file_name = str(path)
        self.query_one("#editor", TextArea).load_text(text)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "validate":
            self.action_validate()
        elif event.button.id == "submit":
            self.action_submit()

    def send(self, dry_run: bool) -> None:
        text = self.query_one("#editor", TextArea).text
        if not text.strip():
            self.query_one("#new-result", Static).update("The job file is empty: pick an example or a path.")
            return
        client, name = self.app.client, self.file_name
        polling.once(self, "submit", lambda: feeds.submit(client, name, text, dry_run))

    def action_validate(self) -> None:
        self.send(dry_run=True)

    def action_submit(self) -> None:
        self.send(dry_run=False)

    def on_validated(self, message: m.Validated) -> None:
        result = self.query_one("#new-result", Static)
        if message.ok:
            result.update(render_plan(message.plan))
        else:
            result.update("\n".join(message.errors))
        if message.plan:
            self.query_one("#new-plan-bar", MemoryBar).show(views.plan_memory_view(message.plan))

    def on_action_done(self, message: m.ActionDone) -> None:
        if message.action == "submit":
            self.query_one("#new-result", Static).update(message.text)

    def on_action_failed(self, message: m.ActionFailed) -> None:
        if message.action == "submit":
            self.query_one("#new-result", Static).update(message.text)
