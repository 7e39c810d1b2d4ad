"""The textual tool-call convention: parsing what a model writes, checking arguments, rendering for the template."""

from __future__ import annotations

import json

import pytest

from appliance.agents.toolcalls import (
    ToolSchemaError,
    check_arguments,
    function_tool,
    parse_tool_calls,
    template_messages,
    tools_prompt,
)
from appliance.agents.trajectory import (
    AssistantMessage,
    FunctionCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)

MULTIPLY = function_tool("multiply", "Multiply.", {"a": {"type": "integer"}, "b": {"type": "integer"}})


def _call(name, arguments):
    return ToolCall(id="c1", function=FunctionCall(name=name, arguments=json.dumps(arguments)))


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>',
            [("multiply", {"a": 3, "b": 4})],
        ),
        (
            'Let me compute.\n<tool_call>\n```json\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n```\n</tool_call>',
            [("multiply", {"a": 3, "b": 4})],
        ),
        # the turn ended (end-of-turn token) before the closing tag
        ('<tool_call>{"name": "read", "arguments": {"message_id": "m0001"}}', [("read", {"message_id": "m0001"})]),
        ('<tool_call>{"name": "move", "parameters": {"direction": "up"}}</tool_call>', [("move", {"direction": "up"})]),
        (
            '<tool_call>{"name": "move", "arguments": "{\\"direction\\": \\"up\\"}"}</tool_call>',
            [("move", {"direction": "up"})],
        ),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b"}</tool_call>',
            [("a", {}), ("b", {})],
        ),
        (
            '<tool_call>{"name": "a", "arguments": {}}<tool_call>{"name": "b", "arguments": {}}</tool_call>',
            [("a", {}), ("b", {})],
        ),
        ("The answer is <answer>12</answer>.", []),
    ],
)
def test_readable_calls_are_parsed(text, expected):
    parsed = parse_tool_calls(text, call_id_prefix="t7")
    assert parsed.errors == []
    assert [(call.function.name, json.loads(call.function.arguments)) for call in parsed.calls] == expected
    assert [call.id for call in parsed.calls] == [f"t7_{n}" for n in range(1, len(expected) + 1)]


@pytest.mark.parametrize(
    "text, message",
    [
        ('<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4</tool_call>', "tool call 1 is not valid JSON"),
        ("<tool_call>multiply(3, 4)</tool_call>", "tool call 1 holds no JSON object"),
        ('<tool_call>{"arguments": {"a": 3}}</tool_call>', 'tool call 1 has no "name"'),
        ('<tool_call>{"name": "move", "arguments": ["up"]}</tool_call>', '"arguments" must be a JSON object, not list'),
        ('<tool_call>{"name": "move", "arguments": "up"}</tool_call>', '"arguments" is a string that is not JSON'),
    ],
)
def test_unreadable_calls_become_one_error_each(text, message):
    parsed = parse_tool_calls(text + ' <tool_call>{"name": "ok", "arguments": {}}</tool_call>')
    assert len(parsed.errors) == 1 and message in parsed.errors[0]
    assert [call.function.name for call in parsed.calls] == ["ok"]
    assert [call.id for call in parsed.calls] == ["call_2"]  # numbered by position, the bad one included


@pytest.mark.parametrize(
    "call, message",
    [
        (_call("divide", {"a": 1}), "unknown tool 'divide'; the tools are: multiply"),
        (_call("multiply", {"a": 1}), "'b' is a required property"),
        (_call("multiply", {"a": 1, "b": "two"}), "at b: 'two' is not of type 'integer'"),
        (_call("multiply", {"a": 1, "b": 2, "c": 3}), "Additional properties are not allowed"),
    ],
)
def test_arguments_are_checked_against_the_tool_schema(call, message):
    arguments, problem = check_arguments([MULTIPLY], call)
    assert arguments is None and message in problem


def test_valid_arguments_pass():
    assert check_arguments([MULTIPLY], _call("multiply", {"a": 1, "b": 2})) == ({"a": 1, "b": 2}, None)


def test_a_tool_with_an_invalid_schema_is_refused_when_declared():
    with pytest.raises(ToolSchemaError, match="tool 'bad': parameters are not a valid JSON schema"):
        function_tool("bad", "Bad.", {"x": {"type": "no-such-type"}})


def test_template_messages_describe_tools_and_write_structured_calls_as_text():
    call = _call("multiply", {"a": 3, "b": 4})
    messages = [
        SystemMessage(content="Be careful."),
        UserMessage(content="What is 3 * 4?"),
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(tool_call_id="c1", content="12"),
        AssistantMessage(content="<answer>12</answer>"),
    ]
    rendered = template_messages(messages, [MULTIPLY])
    assert rendered[0] == {"role": "system", "content": "Be careful.\n\n" + tools_prompt([MULTIPLY])}
    assert '"name": "multiply"' in rendered[0]["content"] and "<tool_call>" in rendered[0]["content"]
    # a call that came structured (e.g. from an OpenAI client) is written in the convention the model reads
    assert rendered[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>',
    }
    assert rendered[3] == {"role": "tool", "content": "12"}
    assert rendered[4] == {"role": "assistant", "content": "<answer>12</answer>"}
    # without a system message the tools block becomes one; without tools nothing is added
    assert template_messages(messages[1:2], [MULTIPLY])[0]["role"] == "system"
    assert template_messages(messages[1:2], []) == [{"role": "user", "content": "What is 3 * 4?"}]


def test_text_calls_are_not_written_twice():
    text = '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
    parsed = parse_tool_calls(text)
    message = AssistantMessage(content=text, tool_calls=parsed.calls)
    assert template_messages([message], [])[0]["content"] == text
