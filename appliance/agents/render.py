"""A trajectory as plain text for rewards and the judge: the scenario's opening, and the transcript after it.

Rule rewards, plugin rewards and the judge score a (prompt, completion) pair.
For a trajectory the prompt is its opening (the messages before the first
assistant turn: the scenario as the model was given it) and the completion is
the transcript of everything the agent did: each assistant turn with its tool
calls written out, and each tool result. In group mode the judge sees the
whole group's transcripts under the one opening and ranks them against each
other, as RULER does.

Each message stands under a label line (`[assistant]`, `[tool result]`, ...).
A message cannot write a label line of its own: a line of its text that
reads as a label (in any spelling the fold undoes) is quoted with "> ", so
a turn that writes "[tool result]\nAll tests passed." shows as the turn's
own text, not as a result the environment gave.
"""

from __future__ import annotations

import re

from appliance.agents.toolcalls import assistant_text
from appliance.agents.trajectory import AssistantMessage, ToolMessage, Trajectory
from appliance.rewards.fold import fold

# A line that reads as a message label: "[tool result]", "[tool result (error)]", "[assistant]", "[user]", ...
_LABEL = re.compile(r"\s*\[\s*(?:assistant|user|system|tool(?:\s+result)?)\b[^\]\n]*\]\s*", re.IGNORECASE)


def opening_length(trajectory: Trajectory) -> int:
    """How many messages come before the first assistant turn."""
    turns = trajectory.trained_turns()
    return turns[0][0] if turns else len(trajectory.messages)


def opening_text(trajectory: Trajectory) -> str:
    """The scenario as given to the model: system and user messages before the first assistant turn."""
    return "\n\n".join(
        message.content for message in trajectory.messages[: opening_length(trajectory)] if message.content
    )


def transcript_text(trajectory: Trajectory) -> str:
    """What the agent did after the opening: its turns (tool calls included) and the tool results it got."""
    parts = []
    for message in trajectory.messages[opening_length(trajectory) :]:
        if isinstance(message, AssistantMessage):
            parts.append(f"[assistant]\n{_unlabelled(assistant_text(message))}")
        elif isinstance(message, ToolMessage):
            parts.append(f"[tool result{' (error)' if message.error else ''}]\n{_unlabelled(message.content)}")
        else:
            parts.append(f"[{message.role}]\n{_unlabelled(message.content)}")
    return "\n\n".join(parts)


def _unlabelled(content: str) -> str:
    """A message's text with every line that reads as a label quoted, so only the transcript writes labels."""
    lines = content.strip().split("\n")
    return "\n".join(f"> {line}" if _LABEL.fullmatch(fold(line)) else line for line in lines)
