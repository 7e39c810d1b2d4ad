"""Every key of the screen underneath and of the app, in one modal table."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

ALWAYS = [
    ("ctrl+p", "command palette: every action below, searchable"),
    ("tab / shift+tab", "move between widgets"),
    ("escape", "back to the previous screen"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.under = under

    def keys(self) -> list[tuple[str, str]]:
        rows, seen = [], set()
        for node in (self.under, self.app):
            for binding in node.BINDINGS:
                if isinstance(binding, Binding) and binding.description and binding.key not in seen:
                    seen.add(binding.key)
                    rows.append((binding.key_display or binding.key, binding.description))
        return rows + ALWAYS

    def compose(self) -> ComposeResult:
        table = Table(title=f"Keys: {self.under.title or self.under.__class__.__name__}", box=None, expand=True)
        table.add_column("key", style="bold")
        table.add_column("does")
        for key, description in self.keys():
            table.add_row(key, description)
        with VerticalScroll(id="help"):
            yield Static(table)
            yield Static("escape closes this", classes="hint")
