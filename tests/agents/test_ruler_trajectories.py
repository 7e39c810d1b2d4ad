"""RULER over whole trajectories: the bundled model as judge in group mode ranks a scenario's trajectories
(their opening as the prompt, each transcript of turns, tool calls and tool results as a response) in one
call per group, so an environment needs no reward function of its own."""

from __future__ import annotations

import json

import pytest

from appliance.agents.toolcalls import function_tool
from appliance.agents.trajectory import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    Trajectory,
    TrajectoryGroup,
    UserMessage,
)
from appliance.config.schema import JudgeSpec
from appliance.grpo.trajectories import score_trajectories
from appliance.rewards.registry import WeightedReward

pytestmark = pytest.mark.model

MULTIPLY = function_tool("multiply", "Multiply.", {"a": {"type": "integer"}, "b": {"type": "integer"}})


def _trajectory(a: int, b: int, answer: int, with_tool: bool) -> Trajectory:
    call = f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    turns = (
        [AssistantMessage(content=call), ToolMessage(tool_call_id="call_1_1", content=str(a * b))] if with_tool else []
    )
    return Trajectory(
        scenario_id=f"multiply-{a}x{b}",
        tools=[MULTIPLY],
        reward=0.0,
        messages=[
            SystemMessage(content="Use the multiply tool, then answer as <answer>N</answer>."),
            UserMessage(content=f"What is {a} * {b}?"),
            *turns,
            AssistantMessage(content=f"<answer>{answer}</answer>"),
        ],
    )


@pytest.fixture(scope="module")
def judge_engine(demo_model_dir):
    from appliance.engines.hf import HFEngine

    engine = HFEngine.load(demo_model_dir)
    yield engine
    engine.close()


def test_the_judge_ranks_a_group_of_trajectories_in_one_call(judge_engine, tokenizer, tmp_path):
    from appliance.judge.judge import Judge

    groups = [
        TrajectoryGroup(
            scenario_id="multiply-12x34",
            trajectories=[
                _trajectory(12, 34, 408, True),
                _trajectory(12, 34, 400, False),
                _trajectory(12, 34, 12, False),
            ],
        ),
        TrajectoryGroup(
            scenario_id="multiply-21x43",
            trajectories=[
                _trajectory(21, 43, 903, True),
                _trajectory(21, 43, 64, False),
                _trajectory(21, 43, 903, False),
            ],
        ),
    ]
    # The fewest orders a group is read in: the group and its reverse.
    spec = JudgeSpec(model="smollm2-135m-instruct", mode="group", group_orders=2)
    judge = Judge(spec, judge_engine, log_path=tmp_path / "j.jsonl")
    scored = score_trajectories(
        "builtin:calculator",
        groups,
        tokenizer,
        [WeightedReward("judge", 1.0, judge)],
        scale_rewards=True,
        max_tokens=None,
    )

    assert judge.outcomes["ok"] >= 1, judge.outcomes  # at least one group really judged, not the neutral fallback
    scores = scored.scores.per_function["judge"]
    assert len(scores) == 6 and all(0.0 <= score <= 1.0 for score in scores)
    calls = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert len(calls) == 4 and all(call["mode"] == "group" for call in calls)  # per scenario, its two orders
    assert [call["order"] for call in calls] == [0, 1] * 2
    assert {call["view"] for call in calls} == {"full"}  # a transcript has no numeric reference: no differential
    first = calls[0]["prompt"]
    assert "What is 12 * 34?" in first and "What is 21 * 43?" not in first  # the scenario is the prompt
    assert first.count("[tool result]") == 1 and '"name": "multiply"' in first  # whole transcripts are judged
    assert first.count("<answer>") >= 3  # all three trajectories of the group in the one prompt
    ok = [call for call in calls if call["outcome"] == "ok"]
    assert all(len(call["scores"]) == 3 for call in ok)
    # The judge's scores are the trajectories' rewards: group advantages follow them.
    for group in range(2):
        values = scores[3 * group : 3 * group + 3]
        advantages = scored.advantages.advantages[group].tolist()
        if max(values) > min(values):
            assert advantages.index(max(advantages)) == values.index(max(values))
