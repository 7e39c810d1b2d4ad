"""Trajectories as GRPO training data: one sample each, only assistant tokens trained, sampled logprobs kept,
group advantages over trajectory rewards, samples.jsonl records that show the mask, a bound instead of a crash."""

from __future__ import annotations

import pytest

from appliance.agents.toolcalls import function_tool
from appliance.agents.trajectory import (
    AssistantMessage,
    Sampled,
    SystemMessage,
    ToolMessage,
    Trajectory,
    TrajectoryGroup,
    UserMessage,
)
from appliance.grpo.student import pack_batch
from appliance.grpo.trajectories import EnvironmentReward, score_trajectories
from appliance.rewards.registry import WeightedReward

MULTIPLY = function_tool("multiply", "Multiply.", {"a": {"type": "integer"}, "b": {"type": "integer"}})
CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'


def _sampled(tokenizer, text: str, first_logprob: float) -> Sampled:
    ids = tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    return Sampled(token_ids=ids, logprobs=[first_logprob - 0.01 * i for i in range(len(ids))])


def _trajectory(tokenizer, answer: str, reward: float) -> Trajectory:
    return Trajectory(
        scenario_id="multiply-12x34",
        tools=[MULTIPLY],
        reward=reward,
        metrics={"turns": 2.0},
        messages=[
            SystemMessage(content="Use tools."),
            UserMessage(content="What is 12 * 34?"),
            AssistantMessage(content=CALL, sampled=_sampled(tokenizer, CALL, -0.5)),
            ToolMessage(tool_call_id="call_1_1", content="408"),
            AssistantMessage(content=answer, sampled=_sampled(tokenizer, answer, -1.5)),
        ],
    )


@pytest.fixture
def scored(tokenizer):
    groups = [
        TrajectoryGroup(
            scenario_id="multiply-12x34",
            trajectories=[
                _trajectory(tokenizer, "<answer>408</answer>", 1.2),
                _trajectory(tokenizer, "<answer>400</answer>", 0.2),
            ],
        )
    ]
    rewards = [WeightedReward("environment", 1.0, EnvironmentReward())]
    return score_trajectories("builtin:calculator", groups, tokenizer, rewards, scale_rewards=True, max_tokens=None)


def test_a_trajectory_trains_as_one_sample_with_only_its_sampled_tokens_masked_in(tokenizer, scored):
    samples = scored.train_samples(use_engine_logprobs=True)
    assert [s.advantage > 0 for s in samples] == [True, False]  # the right answer is preferred within its group
    for sample, item, trajectory in zip(samples, scored.tokens, scored.flat):
        tokens = item.tokens
        assert sample.prompt_ids + sample.completion_ids == tokens.input_ids
        assert tokenizer.decode(sample.prompt_ids).endswith("<|im_start|>assistant\n")  # prompt = up to turn 1
        sampled = [m.sampled for m in trajectory.assistant_turns()]
        trained = [t for t, m in zip(sample.completion_ids, sample.train_mask) if m]
        assert trained == sampled[0].token_ids + sampled[1].token_ids  # both turns, verbatim, nothing else
        assert sample.trained_tokens == len(trained) < len(sample.completion_ids)  # the tool result is context
        kept = [p for p, m in zip(sample.engine_logprobs, sample.train_mask) if m]
        assert kept == sampled[0].logprobs + sampled[1].logprobs  # sampled logprobs kept as sampled
        assert "408" in tokenizer.decode([t for t, m in zip(sample.completion_ids, sample.train_mask) if not m])

    batch = pack_batch(
        [s.prompt_ids for s in samples],
        [s.completion_ids for s in samples],
        tokenizer.pad_token_id,
        [s.train_mask for s in samples],
    )
    for row, sample in enumerate(samples):
        width = len(sample.train_mask)
        assert batch.completion_mask[row, :width].tolist() == sample.train_mask
        assert not batch.completion_mask[row, width:].any()


def test_single_turn_samples_keep_every_completion_token():
    batch = pack_batch([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0)
    assert batch.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    with pytest.raises(ValueError, match="train mask 0 has 1 entries for 2"):
        pack_batch([[5]], [[1, 2]], pad_id=0, train_masks=[[1]])


def test_sample_records_show_the_trained_mask_as_segments(tokenizer, scored):
    records = scored.sample_records(step=3, tokenizer=tokenizer, limit=8)
    assert len(records) == 2
    record = records[0]
    assert set(record) == {
        "step",
        "kind",
        "environment",
        "scenario",
        "reward",
        "rewards",
        "advantage",
        "metrics",
        "messages",
        "segments",
        "trained_tokens",
        "context_tokens",
        "finish_reasons",
    }
    assert (record["step"], record["kind"], record["environment"], record["scenario"]) == (
        3,
        "trajectory",
        "builtin:calculator",
        "multiply-12x34",
    )
    assert record["rewards"] == {"environment": 1.2} and record["reward"] == pytest.approx(1.2)
    assert record["messages"][2]["role"] == "assistant" and record["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1_1",
        "content": "408",
    }
    trained = [s["text"] for s in record["segments"] if s["trained"]]
    assert trained == [CALL + "<|im_end|>", "<answer>408</answer><|im_end|>"]
    assert [s["trained"] for s in record["segments"]] == [False, True, False, True, False]
    assert "".join(s["text"] for s in record["segments"]) == tokenizer.decode(scored.tokens[0].tokens.input_ids)
    assert record["trained_tokens"] + record["context_tokens"] == len(scored.tokens[0].tokens.input_ids)
    assert record["trained_tokens"] == sum(len(m.sampled.token_ids) for m in scored.flat[0].assistant_turns())


def test_an_overlong_trajectory_is_cut_at_the_bound(tokenizer):
    group = TrajectoryGroup(
        scenario_id="multiply-12x34",
        trajectories=[
            _trajectory(tokenizer, "<answer>408</answer>", 1.0),
            _trajectory(tokenizer, "<answer>1</answer>", 0.0),
        ],
    )
    full = score_trajectories(
        "c", [group], tokenizer, [WeightedReward("environment", 1.0, EnvironmentReward())], True, max_tokens=None
    )
    bound = len(full.tokens[0].tokens.input_ids) - 5  # inside the second assistant turn
    cut = score_trajectories(
        "c", [group], tokenizer, [WeightedReward("environment", 1.0, EnvironmentReward())], True, max_tokens=bound
    )
    assert cut.truncated == 2
    samples = cut.train_samples(use_engine_logprobs=True)
    assert all(len(s.prompt_ids) + len(s.completion_ids) == bound for s in samples)
    assert cut.sample_records(1, tokenizer, 8)[0]["truncated"] is True


def test_groups_must_share_a_size_of_at_least_two(tokenizer):
    group = TrajectoryGroup(scenario_id="multiply-12x34", trajectories=[_trajectory(tokenizer, "x", 1.0)])
    with pytest.raises(ValueError, match="at least 2"):
        score_trajectories("c", [group], tokenizer, [], True, None)


def test_worked_example_turns_are_context_never_trained(tokenizer):
    example = '<tool_call>{"name": "multiply", "arguments": {"a": 23, "b": 41}}</tool_call>'
    plain = _trajectory(tokenizer, "<answer>408</answer>", 1.0)
    messages = list(plain.messages)
    messages[1:1] = [UserMessage(content="What is 23 * 41?"), AssistantMessage(content=example)]
    with_example = plain.model_copy(update={"messages": messages, "context_messages": 3})
    group = TrajectoryGroup(scenario_id="multiply-12x34", trajectories=[with_example, with_example])
    scored = score_trajectories("c", [group], tokenizer, [], True, None)
    record = scored.sample_records(1, tokenizer, 1)[0]
    trained = [s["text"] for s in record["segments"] if s["trained"]]
    assert trained == [CALL + "<|im_end|>", "<answer>408</answer><|im_end|>"]  # the example is not among them
    assert example in record["segments"][0]["text"] and not record["segments"][0]["trained"]
    assert "What is 12 * 34?" in scored.flat[0].messages[3].content
