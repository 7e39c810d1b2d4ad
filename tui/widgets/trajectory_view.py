"""One agent trajectory in the Samples tab: scenario, reward and advantage, the turns with their tool calls
and results, and the trained mask (the rendered text, trained tokens highlighted, with a legend and counts).

Input is appliance.service.samples.Trajectory (parsed from a samples.jsonl line); output is a Rich renderable.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from appliance.service.samples import Trajectory, Turn, elide
from tui.widgets import formatting

TRAINED_STYLE = "bold black on green"
CONTEXT_STYLE = "dim"
ROLE_STYLES = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}
TURN_CHARS = 300  # a longer turn (a system prompt, a tool result) shows its start and end
CONTEXT_CHARS = 120  # the same for a context segment of the mask; trained segments show whole


def legend() -> Text:
    return Text.assemble(
        ("mask      ", "bold"),
        (" trained ", TRAINED_STYLE),
        " assistant tokens  ",
        (" context ", "reverse dim"),
        " the rest, not trained",
    )


def turn_text(trajectory: Trajectory, turn: Turn) -> Text:
    text = Text()
    if turn.role == "tool":
        text.append(f"{trajectory.tool_name(turn)} → ", style="bold yellow")
    if turn.text.strip():
        text.append(elide(turn.text.strip(), TURN_CHARS))
    for call in turn.tool_calls:
        if text:
            text.append("\n")
        text.append("call ", style="bold green")
        text.append(call.label, style="green")
    return text


def mask_text(trajectory: Trajectory) -> Text:
    text = Text()
    for segment in trajectory.segments:
        if segment.trained:
            text.append(segment.text, style=TRAINED_STYLE)
        else:
            text.append(elide(segment.text, CONTEXT_CHARS), style=CONTEXT_STYLE)
    return text


def render_trajectory(trajectory: Trajectory, number: int) -> RenderableType:
    head = Table.grid(padding=(0, 1))
    head.add_column(style="bold", width=9)
    head.add_column(ratio=1)
    head.add_row(
        f"#{number}",
        Text.assemble((trajectory.environment or "trajectory", "bold"), "  scenario ", (trajectory.scenario, "italic")),
    )
    rewards = "  ".join(f"{name} {formatting.number(value, 2)}" for name, value in sorted(trajectory.rewards.items()))
    head.add_row(
        "reward", f"{formatting.number(trajectory.reward, 2)}  {rewards}   advantage {_signed(trajectory.advantage)}"
    )
    if trajectory.metrics:
        head.add_row(
            "metrics", "  ".join(f"{name} {_value(value)}" for name, value in sorted(trajectory.metrics.items()))
        )
    head.add_row(
        "tokens",
        Text.assemble(
            (_count(trajectory.trained_tokens), TRAINED_STYLE),
            " trained  ",
            _count(trajectory.context_tokens),
            " context",
            ("  cut at the job's token bound", "bold red") if trajectory.truncated else "",
        ),
    )
    turns = Table.grid(padding=(0, 1))
    turns.add_column(width=9)
    turns.add_column(ratio=1)
    for turn in trajectory.turns:
        turns.add_row(
            Text(turn.role, style=f"bold {ROLE_STYLES.get(turn.role, '')}".strip()), turn_text(trajectory, turn)
        )
    parts: list[RenderableType] = [head, turns]
    if trajectory.segments:
        parts += [legend(), mask_text(trajectory)]
    else:
        parts.append(Text("no trained mask recorded", style="italic"))
    return Group(*parts, Text(""))


def _count(value: int | None) -> str:
    return formatting.MISSING if value is None else str(value)


def _value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else formatting.number(value, 2)


def _signed(value: float | None) -> str:
    return formatting.MISSING if value is None else f"{value:+.2f}"
