"""Trajectories: the chat messages of one agent rollout, its reward and metrics, and groups of them.

Messages follow the OpenAI chat shape (so a trajectory can come from, or be
sent to, an OpenAI-compatible client unchanged): system, user, assistant
(text and/or `tool_calls`, each `{"id", "type": "function", "function":
{"name", "arguments": "<json text>"}}`) and tool results (`role: "tool"`,
`tool_call_id`). An assistant message produced by an engine also carries the
token ids it sampled and their log-probabilities (`sampled`), so that the
trainer trains on exactly those tokens. A TrajectoryGroup is the GRPO group:
N rollouts of one scenario.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionCall(_Strict):
    name: str
    arguments: str = "{}"  # JSON text, as in the OpenAI API

    def parsed_arguments(self) -> Any:
        return json.loads(self.arguments)


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Sampled(_Strict):
    """What the engine sampled for one assistant turn: token ids with the log-probability of each."""

    token_ids: list[int]
    logprobs: list[float]
    # The ids of the prompt the engine generated from, when the client knows them (drift checks).
    prompt_token_ids: list[int] | None = None
    finish_reason: str = "stop"

    @model_validator(mode="after")
    def _same_length(self) -> "Sampled":
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"sampled has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
        return self


class SystemMessage(_Strict):
    role: Literal["system"] = "system"
    content: str


class UserMessage(_Strict):
    role: Literal["user"] = "user"
    content: str


class AssistantMessage(_Strict):
    """`content` is the text the model wrote, tool-call markup included when calls are written as text."""

    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    sampled: Sampled | None = None


class ToolMessage(_Strict):
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str
    # True when the call failed (malformed, unknown tool, bad arguments); environments count these.
    error: bool = False


Message = Annotated[Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")]


class Trajectory(_Strict):
    """One rollout: the conversation, the tools offered, the reward and what the environment measured."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    scenario_id: str
    messages: list[Message]
    tools: list[dict] = Field(default_factory=list)  # OpenAI tool schema: {"type": "function", "function": {...}}
    reward: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # The first `context_messages` messages are context even where they are assistant messages: an
    # environment's worked examples, shown to the model but never trained (0: only non-assistant context).
    context_messages: int = Field(default=0, ge=0)

    def trained_turns(self) -> list[tuple[int, AssistantMessage]]:
        """(index, message) of the assistant turns that train: every one after the first `context_messages`."""
        return [
            (index, message)
            for index, message in enumerate(self.messages)
            if isinstance(message, AssistantMessage) and index >= self.context_messages
        ]

    def assistant_turns(self) -> list[AssistantMessage]:
        return [message for _, message in self.trained_turns()]

    def to_openai(self) -> list[dict]:
        """The messages as an OpenAI chat-completions `messages` list (no appliance-only fields)."""
        out = []
        for message in self.messages:
            data = message.model_dump(exclude={"sampled", "error"}, exclude_none=True)
            if isinstance(message, AssistantMessage) and not message.tool_calls:
                data.pop("tool_calls")
            out.append(data)
        return out


class TrajectoryGroup(_Strict):
    """N rollouts of one scenario: advantages are computed within the group."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    scenario_id: str
    trajectories: list[Trajectory]

    @model_validator(mode="after")
    def _one_scenario(self) -> "TrajectoryGroup":
        others = sorted({t.scenario_id for t in self.trajectories} - {self.scenario_id})
        if others:
            raise ValueError(f"group of scenario {self.scenario_id!r} holds trajectories of {others}")
        return self

    def rewards(self) -> list[float]:
        return [trajectory.reward for trajectory in self.trajectories]
