"""The environment plugin interface: scenarios, one rollout against a chat client, tools, a turn limit.

An environment is anything with `name`, `scenarios(split, count, seed)` and
`async rollout(client, scenario) -> Trajectory`. The `client` is a ChatClient:
`async chat(messages, tools) -> AssistantTurn`, so an in-process engine
(`hf_client.EngineChatClient`) or an OpenAI-compatible HTTP client can stand
behind it. Most environments are tool loops, and `ToolEnvironment` is that loop
written once: the model is prompted, its tool calls are checked against the
tools' JSON schemas and answered one tool message each (a malformed or invalid
call gets an error tool message and is counted against the reward), until the
model answers without a call, a tool ends the episode, or `max_turns` is spent.
`rollout_groups` runs the rollouts of a step concurrently.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from appliance.agents.toolcalls import check_arguments
from appliance.agents.trajectory import (
    AssistantMessage,
    Message,
    Sampled,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Trajectory,
    TrajectoryGroup,
    UserMessage,
)
from appliance.conventions import RESULT_TOKENS_ASSUMED
from appliance.errors import ApplianceError

Split = Literal["train", "held_out"]


class AgentEnvironmentError(ApplianceError):
    """An environment cannot be loaded or was asked for something it cannot give."""


@dataclass(frozen=True)
class Scenario:
    """One task instance; `data` is whatever the environment needs to play and score it."""

    id: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class AssistantTurn:
    """One reply of the model: its text, the tool calls read from it, and what the engine sampled."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_errors: list[str] = field(default_factory=list)  # one sentence per call that could not be read
    sampled: Sampled | None = None

    def message(self) -> AssistantMessage:
        return AssistantMessage(content=self.text, tool_calls=self.tool_calls, sampled=self.sampled)


@runtime_checkable
class ChatClient(Protocol):
    async def chat(self, messages: list[Message], tools: list[dict]) -> AssistantTurn:
        """The model's next turn after `messages`, with `tools` (OpenAI tool schema) on offer."""


@runtime_checkable
class Environment(Protocol):
    name: str

    def scenarios(self, split: Split, count: int, seed: int) -> list[Scenario]:
        """`count` scenarios of `split`, the same for the same seed."""

    async def rollout(self, client: ChatClient, scenario: Scenario) -> Trajectory:
        """Play `scenario` with the model behind `client`; the trajectory carries its reward."""


@dataclass
class ToolResult:
    content: str
    done: bool = False  # the episode ends after this call (an answer tool)
    error: bool = False  # the call was valid JSON for the tool but not a legal action (e.g. an illegal move)


class ToolEnvironment(ABC):
    """A tool loop; subclasses give the tools, the opening messages, the tool behaviour and the reward."""

    name: str = "tool-environment"
    max_turns: int = 8  # a subclass's own limit; a job's task.max_turns overrides it
    # What follows one reply before the next, in tokens, as the memory plan budgets it (budget/workload.py).
    # Trajectories longer than the plan's bound are cut there, so a low value costs cut trajectories, not memory.
    result_tokens: int = RESULT_TOKENS_ASSUMED

    @abstractmethod
    def tools(self) -> list[dict]:
        """The tools on offer, in the OpenAI tool schema (see toolcalls.function_tool)."""

    @abstractmethod
    def scenarios(self, split: Split, count: int, seed: int) -> list[Scenario]: ...

    @abstractmethod
    def start(self, scenario: Scenario) -> tuple[Any, str, str]:
        """(state, system prompt, first user message) for a new episode of `scenario`."""

    def examples(self, scenario: Scenario) -> list[Message]:
        """Worked example turns placed between the system prompt and the question: context, never trained."""
        return []

    @abstractmethod
    def call(self, state: Any, name: str, arguments: dict) -> ToolResult:
        """Run one validated tool call against `state`."""

    @abstractmethod
    def score(self, state: Any, episode: "Episode") -> tuple[float, dict[str, float]]:
        """(reward, metrics) of a finished episode; metrics["success"] (0 or 1) is what held-out evaluation counts."""

    async def rollout(self, client: ChatClient, scenario: Scenario) -> Trajectory:
        state, system, user = self.start(scenario)
        tools = self.tools()
        examples = self.examples(scenario)
        messages: list[Message] = [SystemMessage(content=system), *examples, UserMessage(content=user)]
        episode = Episode()
        while episode.turns < self.max_turns and not episode.done:
            # A copy: the client may keep the list it was given while this loop appends the reply.
            turn = await client.chat(list(messages), tools)
            episode.turns += 1
            messages.append(turn.message())
            cut = turn.sampled is not None and turn.sampled.finish_reason == "length"
            episode.cut_turns += cut
            # A turn cut at max_new_tokens keeps what it completed: its whole calls run and, with none, its
            # text is the answer. A call the cut left unfinished is not a malformed one.
            errors = [] if cut else turn.tool_call_errors
            for number, error in enumerate(errors, start=1):
                episode.malformed_calls += 1
                messages.append(
                    ToolMessage(
                        tool_call_id=f"malformed_{episode.turns}_{number}", content=f"error: {error}", error=True
                    )
                )
            if not turn.tool_calls and not errors:  # a reply without a call is the answer
                episode.final_text = turn.text
                break
            for call in turn.tool_calls:
                messages.append(self._answer(state, tools, call, episode))
                if episode.done:  # an answer tool ended the episode: later calls of the turn are not run
                    break
        reward, metrics = self.score(state, episode)
        metrics = {
            "turns": float(episode.turns),
            "tool_calls": float(episode.tool_calls),
            "malformed_calls": float(episode.malformed_calls),
            "invalid_calls": float(episode.invalid_calls),
            "cut_turns": float(episode.cut_turns),
            "turn_limit_reached": float(
                episode.turns >= self.max_turns and not episode.done and episode.final_text is None
            ),
            **metrics,
        }
        return Trajectory(
            scenario_id=scenario.id,
            messages=messages,
            tools=tools,
            reward=reward,
            metrics=metrics,
            metadata={"environment": self.name},
            context_messages=1 + len(examples),  # the system prompt and the worked examples are never trained
        )

    def _answer(self, state: Any, tools: list[dict], call: ToolCall, episode: "Episode") -> ToolMessage:
        episode.tool_calls += 1
        arguments, problem = check_arguments(tools, call)
        if problem is not None:
            episode.invalid_calls += 1
            return ToolMessage(tool_call_id=call.id, content=f"error: {problem}", error=True)
        result = self.call(state, call.function.name, arguments)
        episode.invalid_calls += int(result.error)
        episode.done = episode.done or result.done
        return ToolMessage(tool_call_id=call.id, content=result.content, error=result.error)


@dataclass
class Episode:
    """What the tool loop counted while playing; `score` reads it."""

    turns: int = 0
    tool_calls: int = 0
    malformed_calls: int = 0  # calls that could not be read at all
    cut_turns: int = 0  # turns the engine cut at max_new_tokens (finish_reason "length")
    invalid_calls: int = 0  # readable calls refused: unknown tool, bad arguments, illegal action
    done: bool = False
    final_text: str | None = None


async def rollout_group(environment: Environment, client: ChatClient, scenario: Scenario, size: int) -> TrajectoryGroup:
    """`size` concurrent rollouts of one scenario: one GRPO group."""
    trajectories = await asyncio.gather(*(environment.rollout(client, scenario) for _ in range(size)))
    return TrajectoryGroup(scenario_id=scenario.id, trajectories=list(trajectories))


async def rollout_groups(
    environment: Environment, client: ChatClient, scenarios: list[Scenario], group_size: int
) -> list[TrajectoryGroup]:
    """One group per scenario, every rollout of the step running concurrently."""
    return list(
        await asyncio.gather(*(rollout_group(environment, client, scenario, group_size) for scenario in scenarios))
    )
