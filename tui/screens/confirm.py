"""A yes/no question in a modal; dismisses with True only on an explicit yes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, action: str) -> None:
        super().__init__()
        self.question = question
        self.action_name = action

    def compose(self) -> ComposeResult:
        with Grid(id="confirm"):
            yield Label(self.question, id="question")
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.action_name.capitalize()} (y)", variant="warning", id="yes")
                yield Button("Keep (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
