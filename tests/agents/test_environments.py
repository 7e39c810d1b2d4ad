"""Each built-in environment played end to end by a scripted policy, rollouts running concurrently.

The policies below stand in for "a model": they write text (tool calls in the
`<tool_call>` convention) that goes through the real parser, tool loop,
argument checks and rewards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
from typing import Callable

import pytest

from appliance.agents.environment import AgentEnvironmentError, AssistantTurn, Scenario, rollout_groups
from appliance.agents.envs.calculator import CalculatorEnvironment
from appliance.agents.envs.email_search import EmailSearchEnvironment
from appliance.agents.envs.game2048 import Game2048Environment, GameState, slide, slide_row_left
from appliance.agents.envs.mailbox import generate_mailbox
from appliance.agents.toolcalls import parse_tool_calls
from appliance.agents.trajectory import AssistantMessage, Message, Sampled, ToolMessage, UserMessage


class ScriptedClient:
    """A ChatClient whose "model" is a policy function from the conversation to the text of the next turn."""

    def __init__(self, policy: Callable[[list[Message]], str]):
        self.policy, self.in_flight, self.max_in_flight, self.calls = policy, 0, 0, 0

    async def chat(self, messages: list[Message], tools: list[dict]) -> AssistantTurn:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.001)  # a model takes time; other rollouts run meanwhile
        self.in_flight -= 1
        self.calls += 1
        text = self.policy(messages)
        parsed = parse_tool_calls(text, call_id_prefix=f"call_{self.calls}")
        return AssistantTurn(text=text, tool_calls=parsed.calls, tool_call_errors=parsed.errors)


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def last_tool(messages: list[Message]) -> ToolMessage | None:
    return messages[-1] if isinstance(messages[-1], ToolMessage) else None


def question(messages: list[Message]) -> str:
    return [m.content for m in messages if isinstance(m, UserMessage)][-1]  # the scenario's, after any example


def calculator_policy(messages: list[Message]) -> str:
    tool = last_tool(messages)
    if tool is not None and not tool.error:
        return f"The product is <answer>{tool.content}</answer>"
    a, b = re.findall(r"\d+", question(messages))
    return call("multiply", f'{{"a": {a}, "b": {b}}}')


def only(groups):
    [group] = groups
    [trajectory] = group.trajectories
    return trajectory


def play(environment, policy, scenarios, group_size=1):
    client = ScriptedClient(policy)
    return asyncio.run(rollout_groups(environment, client, scenarios, group_size)), client


# --- calculator -------------------------------------------------------------------------------------------------


def test_calculator_rollouts_run_concurrently_and_score_the_right_answer():
    environment = CalculatorEnvironment()
    scenarios = environment.scenarios("train", 4, seed=1)
    groups, client = play(environment, calculator_policy, scenarios, group_size=3)
    assert [group.scenario_id for group in groups] == [scenario.id for scenario in scenarios]
    assert client.max_in_flight == 12  # every rollout of the step waited for the "model" at once
    for group, scenario in zip(groups, scenarios):
        assert len(group.trajectories) == 3
        for trajectory in group.trajectories:
            a, b = scenario.data["a"], scenario.data["b"]
            roles = [m.role for m in trajectory.messages]
            # the worked episode (question, call, result, answer: context) comes before the scenario's question
            assert roles == [
                "system",
                *["user", "assistant", "tool", "assistant"] * 2,
                "user",
                "assistant",
                "tool",
                "assistant",
            ]
            assert trajectory.context_messages == 9 and len(trajectory.assistant_turns()) == 2
            assert trajectory.messages[11].content == str(a * b)
            assert trajectory.reward == pytest.approx(1.2)
            assert trajectory.metrics == {
                "turns": 2.0,
                "tool_calls": 1.0,
                "malformed_calls": 0.0,
                "invalid_calls": 0.0,
                "cut_turns": 0.0,
                "turn_limit_reached": 0.0,
                "correct": 1.0,
                "used_tool": 1.0,
                "success": 1.0,
            }


def test_calculator_splits_are_disjoint_and_seeded():
    environment = CalculatorEnvironment(operand_min=11, operand_max=30, held_out=50)
    train = {s.id for s in environment.scenarios("train", 1000, seed=0)}
    held_out = {s.id for s in environment.scenarios("held_out", 1000, seed=0)}
    assert len(held_out) == 50 and len(train) == 400 - 50 and not train & held_out
    assert environment.scenarios("train", 5, seed=3) == environment.scenarios("train", 5, seed=3)
    assert environment.scenarios("train", 5, seed=3) != environment.scenarios("train", 5, seed=4)


def test_a_malformed_call_gets_an_error_tool_message_and_costs_reward():
    def sloppy(messages):
        if last_tool(messages) is None:  # the first turn
            return '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": </tool_call>'
        if last_tool(messages).error:
            return calculator_policy(messages[:10])  # as if the bad call never happened
        return calculator_policy(messages)

    environment = CalculatorEnvironment()
    trajectory = only(play(environment, sloppy, [environment.scenarios("train", 1, seed=2)[0]])[0])
    error = trajectory.messages[11]  # after the worked example and the question
    assert isinstance(error, ToolMessage) and error.error and "tool call 1 is not valid JSON" in error.content
    assert trajectory.metrics["malformed_calls"] == 1 and trajectory.metrics["correct"] == 1
    assert trajectory.reward == pytest.approx(1.2 - 0.25)


def test_arguments_outside_the_schema_are_refused_and_cost_reward():
    def stringly(messages):
        if last_tool(messages) is None:  # the first turn
            return call("multiply", '{"a": "12", "b": 3}')
        return "I could not do it."

    environment = CalculatorEnvironment()
    trajectory = only(play(environment, stringly, environment.scenarios("train", 1, seed=2))[0])
    assert "bad arguments for 'multiply' at a: '12' is not of type 'integer'" in trajectory.messages[11].content
    assert trajectory.metrics["invalid_calls"] == 1 and trajectory.metrics["correct"] == 0
    assert trajectory.reward == pytest.approx(-0.25)


def test_the_turn_limit_ends_an_episode_that_never_answers():
    def forever(messages):
        return calculator_policy(messages[:10])  # always the first turn: call again

    environment = CalculatorEnvironment()
    trajectory = only(play(environment, forever, environment.scenarios("train", 1, seed=5))[0])
    assert trajectory.metrics["turns"] == environment.max_turns == 3
    assert trajectory.metrics["correct"] == 0 and trajectory.reward == pytest.approx(0.2)


# --- email search -------------------------------------------------------------------------------------------------

FACTS = [r"room (\w+)\.", r"Tracking number: (TRK\d+)", r"door code of the .+ is (\d+)", r"due on (\w+ \d+)\."]
STOP = {"what", "when", "which", "in", "is", "the", "of", "a"}


def email_policy(messages: list[Message]) -> str:
    """Search with the question's content words, read the first hit, answer with the fact it states."""
    tool = last_tool(messages)
    if tool is None:
        words = [w for w in re.findall(r"[A-Za-z]+", question(messages)) if w.lower() not in STOP]
        return "Searching.\n" + call("search", f'{{"keywords": "{" ".join(words)}"}}')
    if tool.content.startswith("id: "):
        fact = next(match.group(1) for pattern in FACTS if (match := re.search(pattern, tool.content)))
        email_id = tool.content.split("\n")[0].removeprefix("id: ")
        return call("answer", f'{{"answer": "{fact}", "message_id": "{email_id}"}}')
    first_hit = tool.content.split(" | ")[0]
    return call("read", f'{{"message_id": "{first_hit}"}}')


def test_email_search_finds_the_right_email_in_three_calls():
    environment = EmailSearchEnvironment()
    scenarios = environment.scenarios("train", 8, seed=0)
    groups, client = play(environment, email_policy, scenarios, group_size=2)
    assert client.max_in_flight == 16
    for group in groups:
        for trajectory in group.trajectories:
            assert trajectory.metrics["right_email"] == 1 and trajectory.metrics["correct_answer"] == 1
            assert trajectory.metrics["tool_calls"] == 3 and trajectory.reward == pytest.approx(1.5)


def test_email_search_rewards_fewer_steps_and_penalises_bad_ids():
    environment = EmailSearchEnvironment()
    [scenario] = environment.scenarios("train", 1, seed=4)

    def wandering(messages):
        # reads two ids that do not exist, then finds the email as usual
        refused = sum(1 for m in messages if isinstance(m, ToolMessage) and m.error)
        tool = last_tool(messages)
        if tool is not None and ("|" in tool.content or tool.error) and refused < 2:
            return call("read", f'{{"message_id": "x{refused}"}}')
        if tool is not None and tool.error:
            search = next(m for m in messages if isinstance(m, ToolMessage) and "|" in m.content)
            return call("read", f'{{"message_id": "{search.content.split(" | ")[0]}"}}')
        return email_policy(messages)

    trajectory = only(play(environment, wandering, [scenario])[0])
    assert trajectory.metrics["right_email"] == 1 and trajectory.metrics["invalid_calls"] == 2
    assert trajectory.metrics["tool_calls"] == 5
    assert "no email has id 'x0'" in trajectory.messages[5].content
    assert trajectory.reward == pytest.approx(1.5 - 0.05 * 2 - 0.25 * 2)


def test_an_episode_without_an_answer_scores_nothing():
    environment = EmailSearchEnvironment()
    trajectory = only(
        play(
            environment, lambda m: call("search", '{"keywords": "meeting"}'), environment.scenarios("train", 1, seed=0)
        )[0]
    )
    assert trajectory.metrics["turns"] == environment.max_turns and trajectory.metrics["answered"] == 0
    assert trajectory.reward <= 0


def test_the_mailbox_is_seeded_and_every_question_has_one_right_email():
    emails, questions = generate_mailbox(seed=0, size=60)
    assert (emails, questions) == generate_mailbox(seed=0, size=60)
    assert generate_mailbox(seed=1, size=60)[0] != emails
    by_id = {email.id: email for email in emails}
    assert len(questions) >= 30
    for item in questions:
        assert item.answer in by_id[item.email_id].body
    environment = EmailSearchEnvironment()
    train = {s.id for s in environment.scenarios("train", 100, seed=0)}
    held_out = {s.id for s in environment.scenarios("held_out", 100, seed=0)}
    assert held_out and train and not train & held_out and len(train | held_out) == len(questions)


# --- 2048 -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, expected, merged",
    [
        ([2, 2, 2, 2], [4, 4, 0, 0], 8),
        ([2, 2, 4, 0], [4, 4, 0, 0], 4),  # a merged tile does not merge again in the same move
        ([4, 0, 4, 8], [8, 8, 0, 0], 8),
        ([0, 0, 0, 2], [2, 0, 0, 0], 0),
        ([2, 4, 8, 16], [2, 4, 8, 16], 0),
    ],
)
def test_2048_rows_slide_and_merge_once(row, expected, merged):
    assert slide_row_left(row) == (expected, merged)


def test_2048_directions():
    board = [[2, 0, 0, 2], [0, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 4]]
    assert slide(board, "right") == ([[0, 0, 0, 4], [0, 0, 0, 0], [0, 0, 0, 2], [0, 0, 0, 4]], 4)
    assert slide(board, "up") == ([[4, 0, 0, 2], [0, 0, 0, 4], [0, 0, 0, 0], [0, 0, 0, 0]], 4)
    assert slide(board, "down")[0][3] == [4, 0, 0, 4]


def cycle_policy(messages: list[Message]) -> str:
    turn = sum(1 for m in messages if isinstance(m, AssistantMessage))
    return call("move", f'{{"direction": "{["left", "down", "right", "down"][turn % 4]}"}}')


def test_2048_games_are_seeded_per_scenario_and_scored_from_the_board():
    environment = Game2048Environment(target=64, max_turns=12)
    scenarios = environment.scenarios("train", 2, seed=0)
    groups, client = play(environment, cycle_policy, scenarios, group_size=3)
    assert client.max_in_flight == 6
    for group in groups:
        first = group.trajectories[0]
        # the same moves on the same scenario give the same game (call ids aside)
        assert all(
            [m.content for m in t.messages] == [m.content for m in first.messages] and t.reward == first.reward
            for t in group.trajectories
        )
        m = first.metrics
        expected = (
            0.6 * math.log2(m["largest_tile"]) / 6
            + 0.4 * min(1.0, m["merged"] / 64)
            + m["won"]
            - 0.1 * (m["invalid_calls"] + m["malformed_calls"])
        )
        assert first.reward == pytest.approx(expected) and m["merged"] > 0 and m["turns"] == 12
    assert groups[0].trajectories[0].messages[1] != groups[1].trajectories[0].messages[1]
    held_out = {s.data["seed"] for s in environment.scenarios("held_out", 20, seed=0)}
    assert min(held_out) >= 1_000_000 and all(s.data["seed"] < 1_000_000 for s in scenarios)


def test_2048_a_move_that_changes_nothing_is_refused():
    environment = Game2048Environment(target=64)
    state = GameState(rng=__import__("random").Random(0), board=[[2, 0, 0, 0], [4, 0, 0, 0], [0] * 4, [0] * 4])
    result = environment.call(state, "move", {"direction": "left"})
    assert result.error and "moving left changes nothing" in result.content and state.useless_moves == 1
    result = environment.call(state, "move", {"direction": "right"})
    assert not result.error and state.board[0][3] == 2 and state.moves == 1
    assert sum(value != 0 for row in state.board for value in row) == 3  # a new tile spawned


def test_2048_reaching_the_target_ends_the_game():
    environment = Game2048Environment(target=8)
    state = GameState(rng=__import__("random").Random(0), board=[[4, 4, 0, 0], [0] * 4, [0] * 4, [0] * 4])
    result = environment.call(state, "move", {"direction": "left"})
    assert result.done and "You reached 8" in result.content


def test_scenario_ids_are_stable():
    assert Game2048Environment().scenarios("train", 3, seed=9) == Game2048Environment().scenarios("train", 3, seed=9)
    assert isinstance(Game2048Environment().scenarios("train", 1, seed=9)[0], Scenario)


# --- worked examples (environment option worked_examples) -----------------------------------------------------------


def test_email_search_worked_episode_is_real_context_and_leaves_the_training_split():
    plain, shown = EmailSearchEnvironment(), EmailSearchEnvironment(worked_examples=1)
    [scenario] = shown.scenarios("train", 1, seed=0)
    assert plain.examples(scenario) == []
    example = shown.examples(scenario)
    assert [type(m).__name__ for m in example] == ["UserMessage"] + ["AssistantMessage", "ToolMessage"] * 3
    [asked] = [q for q in plain._splits["train"] if q.question == example[0].content]
    assert asked not in shown._splits["train"] and shown._splits["held_out"] == plain._splits["held_out"]
    assert [parse_tool_calls(m.content).calls[0].function.name for m in example[1::2]] == ["search", "read", "answer"]
    assert asked.email_id in example[2].content and example[4].content.startswith(f"id: {asked.email_id}")
    assert asked.answer in example[5].content and example[6].content == "answer recorded"
    trajectory = only(play(shown, email_policy, [scenario])[0])
    assert trajectory.context_messages == 1 + len(example) and trajectory.messages[1:8] == example
    assert trajectory.metrics["right_email"] == 1 and trajectory.metrics["tool_calls"] == 3  # its own episode only


def test_2048_worked_moves_come_from_a_game_outside_both_splits():
    environment = Game2048Environment(worked_examples=3)
    example = environment.examples(environment.scenarios("train", 1, seed=0)[0])
    assert [type(m).__name__ for m in example] == ["UserMessage"] + ["AssistantMessage", "ToolMessage"] * 3
    moves = [parse_tool_calls(m.content).calls[0].function.arguments for m in example[1::2]]
    assert len(set(moves)) == 3 and not any(m.error for m in example[2::2])  # every shown move moved
    assert Game2048Environment().examples(Scenario(id="x", data={"seed": 1})) == []
    with pytest.raises(AgentEnvironmentError, match="worked_examples"):
        Game2048Environment(worked_examples=9)
    with pytest.raises(AgentEnvironmentError, match="worked_examples"):
        EmailSearchEnvironment(worked_examples=-1)


def test_email_search_counts_a_stated_fact_not_a_substring():
    from appliance.agents.envs.email_search import states_fact

    assert states_fact("2026-03-14", "2026-03-14")
    assert states_fact("The report is due on 2026-03-14.", "2026-03-14")
    assert not states_fact("1234", "123")  # a longer number holds the digits, not the fact
    assert not states_fact("2026-03-15", "2026-03-14")
    # every date of a year listed: the fact is in there, but that is a dump, not an answer
    dump = " ".join(f"2026-03-{day:02d}" for day in range(1, 29))
    assert "2026-03-14" in dump and not states_fact(dump, "2026-03-14")


class CutClient(ScriptedClient):
    """Every turn is cut at max_new_tokens (finish_reason "length"), as a model that rambles on is."""

    async def chat(self, messages: list[Message], tools: list[dict]) -> AssistantTurn:
        turn = await super().chat(messages, tools)
        return dataclasses.replace(turn, sampled=Sampled(token_ids=[1], logprobs=[-0.5], finish_reason="length"))


def test_a_turn_cut_after_a_whole_call_runs_the_call_and_the_answer_still_counts():
    def rambling(messages: list[Message]) -> str:  # a whole call, then the start of another, cut
        tool = last_tool(messages)
        if tool is not None and not tool.error:
            return f"The product is <answer>{tool.content}</answer> and so on and"
        return calculator_policy(messages) + ' then <tool_call>{"name": "multi'

    environment = CalculatorEnvironment()
    scenario = environment.scenarios("train", 1, seed=3)[0]
    trajectory = asyncio.run(environment.rollout(CutClient(rambling), scenario))

    assert trajectory.metrics["tool_calls"] == 1.0 and trajectory.metrics["malformed_calls"] == 0.0
    assert trajectory.metrics["cut_turns"] == 2.0
    assert trajectory.metrics["success"] == 1.0 and trajectory.reward > 0
