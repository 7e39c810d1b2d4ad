"""An external client's messages are checked before anything renders them: bad tool-call arguments are a 400."""

from __future__ import annotations

import pytest

from appliance.agents.external_source import request_messages


def call_turn(arguments: str) -> list[dict]:
    return [
        {"role": "user", "content": "What is 12 x 34?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": arguments}}],
        },
    ]


@pytest.mark.parametrize("arguments", ["a=12, b=34", "{'a': 12}", "{", "\x00"])
def test_arguments_that_are_not_json_are_refused_naming_the_call(arguments):
    with pytest.raises(ValueError, match=r"messages\.1\.tool_calls\.0\.function\.arguments is not JSON"):
        request_messages(call_turn(arguments))


def test_json_arguments_pass():
    typed = request_messages(call_turn('{"a": 12, "b": 34}'))
    assert typed[1].tool_calls[0].function.parsed_arguments() == {"a": 12, "b": 34}
