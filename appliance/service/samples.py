"""samples.jsonl lines as the operator sees them: single-turn completions and agent trajectories.

A single-turn line is {"step", "question", "reference", "completion", "reward",
"rewards", "advantage", "policy_version", "rank"}. An agent job writes one line per trajectory:

    {"step", "kind": "trajectory", "environment", "scenario", "reward", "rewards",
     "advantage", "metrics", "messages": [OpenAI chat messages], "segments":
     [{"text", "trained"}], "trained_tokens", "context_tokens"[, "truncated": true]}

`segments` is the chat template's rendering of the whole trajectory cut where
the training mask changes: trained (the assistant's sampled tokens) or context
(system, user, tool results, template markup). The TUI's Samples tab and
`appliance jobs samples` both read records through `parse_trajectory` and
`group_records`, so a malformed line degrades to what can be shown, never to
a crash. Pure data; imports nothing heavy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TRAJECTORY = "trajectory"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # the JSON text the model produced, as it produced it
    id: str = ""

    @property
    def label(self) -> str:
        return f"{self.name}({self.arguments})"


@dataclass(frozen=True)
class Turn:
    role: str
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""  # a tool result: the call it answers


@dataclass(frozen=True)
class Segment:
    text: str
    trained: bool


@dataclass(frozen=True)
class Trajectory:
    step: int
    environment: str
    scenario: str
    reward: float | None
    rewards: dict[str, float]
    advantage: float | None
    metrics: dict[str, float]
    turns: tuple[Turn, ...]
    segments: tuple[Segment, ...]
    trained_tokens: int | None
    context_tokens: int | None
    tool_names: dict[str, str] = field(default_factory=dict)  # tool_call_id -> the tool's name
    truncated: bool = False  # cut at the job's token bound: the mask covers only what was kept

    def tool_name(self, turn: Turn) -> str:
        return self.tool_names.get(turn.tool_call_id, "tool")


def is_trajectory(record: dict) -> bool:
    return isinstance(record, dict) and record.get("kind") == TRAJECTORY


def content_text(content: Any) -> str:
    """A message's content: a string, None (an assistant turn that only calls tools) or OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def _tool_call(raw: Any) -> ToolCall:
    raw = raw if isinstance(raw, dict) else {}
    function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):  # some writers keep the parsed object: shown as its JSON text
        arguments = json.dumps(arguments)
    return ToolCall(name=str(function.get("name", "?")), arguments=arguments, id=str(raw.get("id", "")))


def _number(value: Any) -> float | None:
    # bool is an int to Python, but a True reward is a malformed line, not 1.0.
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _numbers(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(key): number for key, item in value.items() if (number := _number(item)) is not None}


def parse_trajectory(record: dict) -> Trajectory:
    turns, names = [], {}
    # Every field is read defensively: a malformed line shows what it can instead of failing the view.
    for message in record.get("messages") or []:
        if not isinstance(message, dict):
            continue
        calls = tuple(_tool_call(call) for call in message.get("tool_calls") or [])
        names.update({call.id: call.name for call in calls if call.id})
        turns.append(
            Turn(
                role=str(message.get("role", "?")),
                text=content_text(message.get("content")),
                tool_calls=calls,
                tool_call_id=str(message.get("tool_call_id") or ""),
            )
        )
    segments = tuple(
        Segment(text=str(segment.get("text", "")), trained=bool(segment.get("trained")))
        for segment in record.get("segments") or []
        if isinstance(segment, dict)
    )
    trained, context = record.get("trained_tokens"), record.get("context_tokens")
    return Trajectory(
        step=int(record.get("step") or 0),
        environment=str(record.get("environment", "")),
        scenario=str(record.get("scenario", "")),
        reward=_number(record.get("reward")),
        rewards=_numbers(record.get("rewards")),
        advantage=_number(record.get("advantage")),
        metrics=_numbers(record.get("metrics")),
        turns=tuple(turns),
        segments=segments,
        trained_tokens=trained if isinstance(trained, int) else None,
        context_tokens=context if isinstance(context, int) else None,
        tool_names=names,
        truncated=record.get("truncated") is True,
    )


def group_records(records: Sequence[dict]) -> dict[int, list[list[dict]]]:
    """samples.jsonl lines -> step -> groups: consecutive lines of one question (single-turn) or one
    scenario of one environment (trajectories) are one GRPO group."""
    steps: dict[int, list[list[dict]]] = {}
    for record in records:
        groups = steps.setdefault(int(record.get("step", 0) or 0), [])
        # Consecutive only: the trainer writes a group's lines together, and the same question may come back
        # later in the step as another group.
        if groups and _group_key(groups[-1][0]) == _group_key(record):
            groups[-1].append(record)
        else:
            groups.append([record])
    return steps


def _group_key(record: dict) -> tuple:
    if is_trajectory(record):
        return (TRAJECTORY, record.get("environment"), record.get("scenario"))
    return ("single", record.get("question"))


def elide(text: str, keep: int) -> str:
    """`text` whole when short, else its first and last keep/2 characters around a count of what was left out."""
    if keep <= 0 or len(text) <= keep + 40:  # cutting fewer characters than the marker takes would save nothing
        return text
    half = keep // 2
    return f"{text[:half]} … [{len(text) - 2 * half} characters] … {text[-half:]}"
