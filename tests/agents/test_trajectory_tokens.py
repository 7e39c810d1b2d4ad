"""Tokenising trajectories with the bundled model's real chat template: hand-checked masks and sampled ids."""

from __future__ import annotations

import json

import pytest

from appliance.agents.tokenize import tokenize_trajectory
from appliance.agents.toolcalls import function_tool, parse_tool_calls, template_messages
from appliance.agents.trajectory import (
    AssistantMessage,
    Sampled,
    SystemMessage,
    ToolMessage,
    Trajectory,
    TrajectoryGroup,
    UserMessage,
)

MULTIPLY = function_tool("multiply", "Multiply.", {"a": {"type": "integer"}, "b": {"type": "integer"}})
CALL_TEXT = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'


def _spans(tokenizer, tokenized):
    """The decoded runs of consecutive tokens with the same mask value: [(mask, text), ...]."""
    runs, current, mask = [], [], None
    for token, flag in zip(tokenized.input_ids, tokenized.assistant_mask):
        if flag != mask and current:
            runs.append((mask, tokenizer.decode(current)))
            current = []
        mask = flag
        current.append(token)
    runs.append((mask, tokenizer.decode(current)))
    return runs


def _tool_trajectory(first: AssistantMessage, last: AssistantMessage) -> Trajectory:
    return Trajectory(
        scenario_id="s1",
        tools=[MULTIPLY],
        messages=[
            SystemMessage(content="Use tools."),
            UserMessage(content="What is 12 * 34?"),
            first,
            ToolMessage(tool_call_id="call_1", content="408"),
            last,
        ],
    )


def test_only_assistant_text_and_its_end_token_are_trained(tokenizer):
    trajectory = _tool_trajectory(AssistantMessage(content=CALL_TEXT), AssistantMessage(content="<answer>408</answer>"))
    tokenized = tokenize_trajectory(tokenizer, trajectory)
    system = template_messages(trajectory.messages, trajectory.tools)[0]["content"]
    # Hand-checked against SmolLM2's ChatML template: the role headers, the newline after <|im_end|>,
    # the system prompt (tools included), the user question and the tool result are context.
    assert _spans(tokenizer, tokenized) == [
        (
            0,
            f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        (1, CALL_TEXT + "<|im_end|>"),
        (0, "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"),
        (1, "<answer>408</answer><|im_end|>"),
        (0, "\n"),
    ]
    # Segment-wise tokenisation equals tokenising the whole rendered conversation at once.
    whole = tokenizer.apply_chat_template(template_messages(trajectory.messages, trajectory.tools), tokenize=False)
    assert tokenized.input_ids == tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert tokenized.trained_tokens == len(
        tokenizer(CALL_TEXT + "<|im_end|><answer>408</answer><|im_end|>", add_special_tokens=False)["input_ids"]
    )
    assert tokenized.context_tokens == len(tokenized.input_ids) - tokenized.trained_tokens
    assert tokenized.logprobs == [None] * len(tokenized.input_ids)  # nothing here was sampled
    assert (tokenized.drifted_turns, tokenized.context_mismatches) == (0, 0)


def _sampled(tokenizer, text: str, stop: bool = True, prompt_ids=None) -> Sampled:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if stop else [])
    return Sampled(
        token_ids=ids,
        logprobs=[-0.01 * (n + 1) for n in range(len(ids))],
        prompt_token_ids=prompt_ids,
        finish_reason="stop" if stop else "length",
    )


def test_sampled_turns_keep_their_ids_and_logprobs_in_place(tokenizer):
    first = _sampled(tokenizer, CALL_TEXT)
    last = _sampled(tokenizer, "<answer>408</answer>")
    trajectory = _tool_trajectory(
        AssistantMessage(content=CALL_TEXT, sampled=first),
        AssistantMessage(content="<answer>408</answer>", sampled=last),
    )
    tokenized = tokenize_trajectory(tokenizer, trajectory)
    trained = [i for i, flag in enumerate(tokenized.assistant_mask) if flag]
    assert [tokenized.input_ids[i] for i in trained] == first.token_ids + last.token_ids
    assert [tokenized.logprobs[i] for i in trained] == first.logprobs + last.logprobs
    assert all(tokenized.logprobs[i] is None for i, flag in enumerate(tokenized.assistant_mask) if not flag)
    assert tokenized.drifted_turns == 0


def test_a_non_canonical_sampled_tokenisation_is_spliced_in_and_counted(tokenizer):
    # The model may sample "answer" as "ans" "wer" where re-tokenising the text gives one token.
    pieces = [
        tokenizer.convert_tokens_to_ids(piece) for piece in ["<", "ans", "wer", ">", "4", "0", "8", "</", "answer", ">"]
    ]
    canonical = tokenizer("<answer>408</answer>", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(pieces) == "<answer>408</answer>" and pieces != canonical  # the premise
    sampled = Sampled(token_ids=pieces + [tokenizer.eos_token_id], logprobs=[-0.5] * (len(pieces) + 1))
    trajectory = _tool_trajectory(
        AssistantMessage(content=CALL_TEXT), AssistantMessage(content="<answer>408</answer>", sampled=sampled)
    )
    tokenized = tokenize_trajectory(tokenizer, trajectory)
    assert tokenized.drifted_turns == 1
    start = len(tokenized.input_ids) - 1 - len(sampled.token_ids)  # the final "\n" is context
    assert tokenized.input_ids[start:-1] == sampled.token_ids
    assert tokenized.assistant_mask[start:-1] == [1] * len(sampled.token_ids)
    assert tokenized.logprobs[start:-1] == [-0.5] * len(sampled.token_ids)


def test_a_turn_cut_by_the_length_limit_does_not_train_the_templates_end_token(tokenizer):
    cut = _sampled(tokenizer, "<answer>40", stop=False)
    trajectory = Trajectory(
        scenario_id="s", messages=[UserMessage(content="Hi"), AssistantMessage(content="<answer>40", sampled=cut)]
    )
    runs = _spans(tokenizer, tokenize_trajectory(tokenizer, trajectory))
    assert runs[-2:] == [(1, "<answer>40"), (0, "<|im_end|>\n")]


def test_training_context_is_checked_against_the_prompt_each_turn_was_generated_from(tokenizer):
    messages = [UserMessage(content="What is 12 * 34?")]
    prompt = tokenizer.apply_chat_template(
        template_messages(messages, [MULTIPLY]), tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    good = Trajectory(
        scenario_id="s",
        tools=[MULTIPLY],
        messages=[
            *messages,
            AssistantMessage(
                content="<answer>408</answer>",
                sampled=_sampled(tokenizer, "<answer>408</answer>", prompt_ids=prompt_ids),
            ),
        ],
    )
    assert tokenize_trajectory(tokenizer, good).context_mismatches == 0
    # The same turn claimed to come from a prompt without the tool description does not match.
    other = tokenizer(
        tokenizer.apply_chat_template(template_messages(messages, []), tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    forged = good.model_copy(deep=True)
    forged.messages[-1] = forged.messages[-1].model_copy(
        update={"sampled": _sampled(tokenizer, "<answer>408</answer>", prompt_ids=other)}
    )
    assert tokenize_trajectory(tokenizer, forged).context_mismatches == 1


def test_trajectories_round_trip_as_json_and_export_openai_messages():
    parsed = parse_tool_calls(CALL_TEXT)
    trajectory = _tool_trajectory(
        AssistantMessage(
            content=CALL_TEXT, tool_calls=parsed.calls, sampled=Sampled(token_ids=[1, 2], logprobs=[-0.1, -0.2])
        ),
        AssistantMessage(content="<answer>408</answer>"),
    )
    trajectory.reward, trajectory.metrics = 1.2, {"turns": 2.0}
    again = Trajectory.model_validate_json(trajectory.model_dump_json())
    assert again == trajectory
    openai = again.to_openai()
    assert openai[2] == {
        "role": "assistant",
        "content": CALL_TEXT,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "multiply", "arguments": json.dumps({"a": 12, "b": 34})},
            }
        ],
    }
    assert openai[3] == {"role": "tool", "tool_call_id": "call_1", "content": "408"}
    assert "tool_calls" not in openai[4] and "sampled" not in openai[2]


def test_sampled_ids_and_logprobs_must_pair_up_and_groups_hold_one_scenario():
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        Sampled(token_ids=[1, 2], logprobs=[-0.1])
    one = Trajectory(scenario_id="a", messages=[UserMessage(content="x")])
    with pytest.raises(ValueError, match=r"group of scenario 'a' holds trajectories of \['b'\]"):
        TrajectoryGroup(scenario_id="a", trajectories=[one, one.model_copy(update={"scenario_id": "b"})])


def test_training_uses_the_served_prompt_ids_not_a_retokenisation(tokenizer):
    messages = [UserMessage(content="What is 12 * 34?")]
    prompt = tokenizer.apply_chat_template(
        template_messages(messages, [MULTIPLY]), tokenize=False, add_generation_prompt=True
    )
    split = prompt.index("What is") + 2  # inside a word: the served ids tokenise the same text otherwise
    served = tokenizer(prompt[:split], add_special_tokens=False)["input_ids"]
    served += tokenizer(prompt[split:], add_special_tokens=False)["input_ids"]
    canonical = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert served != canonical and tokenizer.decode(served) == tokenizer.decode(canonical)
    trajectory = Trajectory(
        scenario_id="s",
        tools=[MULTIPLY],
        messages=[
            *messages,
            AssistantMessage(
                content="<answer>408</answer>", sampled=_sampled(tokenizer, "<answer>408</answer>", prompt_ids=served)
            ),
        ],
    )
    tokens = tokenize_trajectory(tokenizer, trajectory)
    assert tokens.input_ids[: len(served)] == served and tokens.context_mismatches == 0
    assert tokens.assistant_mask[: len(served)] == [0] * len(served)
    assert tokens.input_ids[len(served) :][: len(trajectory.messages[-1].sampled.token_ids)] == (
        trajectory.messages[-1].sampled.token_ids
    )
