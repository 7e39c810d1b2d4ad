"""builtin:calculator, the tool-use task the bundled 135M model can learn on a CPU.

"What is a * b?" for two-digit operands, which a 135M model cannot multiply in
its head but can answer by calling `multiply` and copying the result into
`<answer>N</answer>`. Problems and the held-out split come from the multiply
task (one place for both), so held-out pairs are never trained on.

Reward: 1 for the right final answer, +0.2 for having called `multiply` with
the question's operands, -0.25 for each malformed or refused call, floored at
-1; an episode that ends without an answer scores what its calls earned.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from appliance.agents.environment import Episode, Scenario, Split, ToolEnvironment, ToolResult
from appliance.agents.toolcalls import format_call, function_tool
from appliance.agents.trajectory import AssistantMessage, FunctionCall, Message, ToolCall, ToolMessage, UserMessage
from appliance.conventions import BUILTIN_RESULT_TOKENS
from appliance.rewards.extract import answers_match
from appliance.tasks.task import split_held_out
from appliance.tasks.multiply import multiply_problems

SYSTEM_PROMPT = (
    "You are a careful assistant. Use the multiply tool to multiply numbers; do not multiply in your head. "
    "When you have the result, reply with the final answer as <answer>N</answer>."
)


# The worked episodes' questions: each shown whole (call, tool result, answer) before the question, as context only.
EXAMPLE_OPERANDS = ((23, 41), (17, 56))


@dataclass
class CalculatorState:
    a: int
    b: int
    called_with_operands: bool = False


class CalculatorEnvironment(ToolEnvironment):
    name = "calculator"
    max_turns = 3
    # environment_options each takes, and its bounds (checked at admission, before the class builds anything).
    option_bounds = {
        "operand_min": (0, 500),
        "operand_max": (0, 500),
        "held_out": (0, 100_000),
        "split_seed": (0, 2**32 - 1),
    }
    # The longest tool message the loop writes here, an unreadable call's error with its example call, takes
    # 62 tokens with its template and the next turn's header (a product: 14; tests/agents/test_agent_job_config.py).
    result_tokens = BUILTIN_RESULT_TOKENS["builtin:calculator"]

    def __init__(self, operand_min: int = 11, operand_max: int = 99, held_out: int = 200, split_seed: int = 0):
        problems = multiply_problems(operand_min, operand_max)
        self._splits = dict(
            zip(("train", "held_out"), split_held_out(problems, held_out, split_seed, source="builtin:calculator"))
        )

    def tools(self) -> list[dict]:
        integer = {"type": "integer"}
        return [
            function_tool("multiply", "Multiply two integers and return the product.", {"a": integer, "b": integer})
        ]

    def scenarios(self, split: Split, count: int, seed: int) -> list[Scenario]:
        pool = self._splits[split]
        chosen = random.Random(seed).sample(pool, min(count, len(pool)))
        return [
            Scenario(id=problem.id, data={"a": problem.metadata["a"], "b": problem.metadata["b"]}) for problem in chosen
        ]

    def start(self, scenario: Scenario) -> tuple[CalculatorState, str, str]:
        a, b = scenario.data["a"], scenario.data["b"]
        return CalculatorState(a, b), SYSTEM_PROMPT, f"What is {a} * {b}?"

    def examples(self, scenario: Scenario) -> list[Message]:
        # Worked episodes (context, never trained): the untrained 135M model copies the form of the turns it sees.
        # Two whole episodes are the fewest after which its untrained rollouts both call the tool and answer, so
        # that GRPO gets a signal (bench/README.md, "Figures behind constants in the code", "The calculator's
        # worked episodes").
        return [message for operands in EXAMPLE_OPERANDS for message in _worked_episode(*operands)]

    def call(self, state: CalculatorState, name: str, arguments: dict) -> ToolResult:
        a, b = arguments["a"], arguments["b"]
        state.called_with_operands |= {a, b} == {state.a, state.b}
        return ToolResult(str(a * b))

    def score(self, state: CalculatorState, episode: Episode) -> tuple[float, dict[str, float]]:
        correct = episode.final_text is not None and answers_match(
            _answer_of(episode.final_text), str(state.a * state.b)
        )
        reward = (
            float(correct) + 0.2 * state.called_with_operands - 0.25 * (episode.malformed_calls + episode.invalid_calls)
        )
        return max(-1.0, reward), {
            "correct": float(correct),
            "used_tool": float(state.called_with_operands),
            "success": float(correct),
        }


def _worked_episode(a: int, b: int) -> list[Message]:
    call = ToolCall(
        id=f"example_{a}_{b}", function=FunctionCall(name="multiply", arguments=json.dumps({"a": a, "b": b}))
    )
    return [
        UserMessage(content=f"What is {a} * {b}?"),
        AssistantMessage(content=format_call(call)),
        ToolMessage(tool_call_id=call.id, content=str(a * b)),
        AssistantMessage(content=f"<answer>{a * b}</answer>"),
    ]


def _answer_of(text: str) -> str:
    # answers_match extracts the number (tags first); only the tag counts here, so "12 * 34 = ?" is no answer.
    return text if "<answer>" in text.lower() else ""
