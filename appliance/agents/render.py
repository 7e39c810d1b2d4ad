"""A trajectory as plain text for rewards and the judge: the scenario's opening, and the transcript after it.

Rule rewards, plugin rewards and the judge score a (prompt, completion) pair.
For a trajectory the prompt is its opening (the messages before the first
assistant turn: the scenario as the model was given it) and the completion is
the transcript of everything the agent did: each assistant turn with its tool
calls written out, and each tool result. In group mode the judge sees the
whole group's transcripts under the one opening and ranks them against each
other, as RULER does.
"""

from __future__ import annotations

from appliance.agents.toolcalls import assistant_text
from appliance.agents.trajectory import AssistantMessage, ToolMessage, Trajectory


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
            parts.append(f"[assistant]\n{assistant_text(message).strip()}")
        elif isinstance(message, ToolMessage):
            parts.append(f"[tool result{' (error)' if message.error else ''}]\n{message.content.strip()}")
        else:
            parts.append(f"[{message.role}]\n{message.content.strip()}")
    return "\n\n".join(parts)
