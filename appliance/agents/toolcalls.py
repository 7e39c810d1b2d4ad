"""Tools for models without a native tool-call format: the textual convention, its parser, and argument checks.

The bundled SmolLM2 has no tool-call tokens or template support, so tools are
described in the system prompt and calls are written as JSON inside tags (the
Hermes/Qwen convention, so models trained on it feel at home):

    <tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>

`template_messages` is the one place that turns a trajectory's messages (and
its tools) into the plain `{role, content}` list the chat template renders: the
in-process client uses it to prompt the model and the tokeniser uses it to
rebuild exactly that text for training. `parse_tool_calls` is forgiving about
layout (code fences, a missing closing tag at the end of a turn, `parameters`
for `arguments`, arguments given as a JSON string) and strict about content:
anything it cannot read becomes an error message for a tool result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import jsonschema

from appliance.conventions import CALL_CLOSE, CALL_OPEN
from appliance.agents.trajectory import AssistantMessage, FunctionCall, Message, ToolCall, ToolMessage
from appliance.errors import ApplianceError

# A call ends at its closing tag, at the next opening tag, or at the end of the turn (a reply cut short or a model
# that never closes): layout is forgiven, content is not.
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
# Small models often wrap the JSON in a markdown code fence.
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")
CALL_EXAMPLE = '<tool_call>{"name": "TOOL_NAME", "arguments": {"ARG": VALUE}}</tool_call>'


class ToolSchemaError(ApplianceError):
    """An environment describes a tool that is not a valid OpenAI function tool."""


def function_tool(name: str, description: str, properties: dict, required: list[str] | None = None) -> dict:
    """An OpenAI function tool; its `parameters` must be a valid JSON schema (checked here, once)."""
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(required or properties),  # every argument unless the tool says otherwise
        "additionalProperties": False,  # an argument the tool does not know is a mistake to report, not to ignore
    }
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as error:
        raise ToolSchemaError(f"tool {name!r}: parameters are not a valid JSON schema: {error.message}") from error
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def tools_prompt(tools: list[dict]) -> str:
    """The system-prompt block that describes `tools` and how to call them."""
    described = "\n".join(json.dumps(tool["function"], separators=(", ", ": ")) for tool in tools)
    return (
        "You can call these tools:\n<tools>\n" + described + "\n</tools>\n"
        "To call a tool, write exactly:\n" + CALL_EXAMPLE + "\n"
        "The result comes back in a tool message."
    )


def format_call(call: ToolCall) -> str:
    arguments = json.loads(call.function.arguments or "{}")
    return CALL_OPEN + json.dumps({"name": call.function.name, "arguments": arguments}) + CALL_CLOSE


def assistant_text(message: AssistantMessage) -> str:
    """What the model wrote for this turn: its text, with structured calls written out when the text lacks them."""
    # A client that sends structured tool_calls and empty content (OpenAI's shape) still gets the calls rendered,
    # so the next prompt shows the model what it called.
    if message.tool_calls and CALL_OPEN not in message.content:
        calls = "\n".join(format_call(call) for call in message.tool_calls)
        return f"{message.content}\n{calls}" if message.content else calls
    return message.content


def template_messages(messages: list[Message], tools: list[dict]) -> list[dict[str, str]]:
    """`messages` as `{role, content}` dicts for a chat template, with the tools described in the system prompt."""
    out: list[dict[str, str]] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            out.append({"role": "assistant", "content": assistant_text(message)})
        elif isinstance(message, ToolMessage):
            out.append({"role": "tool", "content": message.content})
        else:
            out.append({"role": message.role, "content": message.content})
    if tools:
        block = tools_prompt(tools)
        # Appended to an existing system prompt, else a system message of its own: templates take one system turn.
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


@dataclass
class ParsedCalls:
    """The calls found in one assistant text, and one error sentence per call that could not be read."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_tool_calls(text: str, call_id_prefix: str = "call") -> ParsedCalls:
    """Every `<tool_call>` in `text`, in order; call ids are `{prefix}_{n}`."""
    parsed = ParsedCalls()
    for number, match in enumerate(_CALL.finditer(text), start=1):
        call, error = _read_call(match.group(1), number)
        if error is not None:
            parsed.errors.append(error)
        else:
            parsed.calls.append(
                ToolCall(
                    id=f"{call_id_prefix}_{number}", function=FunctionCall(name=call[0], arguments=json.dumps(call[1]))
                )
            )
    return parsed


def _read_call(body: str, number: int) -> tuple[tuple[str, dict] | None, str | None]:
    body = _FENCE.sub("", body.strip()).strip()
    where = f"tool call {number}"
    start = body.find("{")
    if start < 0:
        return None, f"{where} holds no JSON object; write {CALL_EXAMPLE}"
    try:
        # raw_decode reads one object and ignores what follows it (a model's trailing remark).
        value, _ = json.JSONDecoder().raw_decode(body, start)
    except json.JSONDecodeError as error:
        return None, f"{where} is not valid JSON ({error.msg} at character {error.pos}); write {CALL_EXAMPLE}"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None, f'{where} has no "name"; write {CALL_EXAMPLE}'
    arguments = value.get("arguments", value.get("parameters", {}))  # some models say "parameters"
    if isinstance(arguments, str):  # OpenAI's own shape: arguments as the JSON text of an object
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, f'{where}: "arguments" is a string that is not JSON; give an object'
    if not isinstance(arguments, dict):
        return None, f'{where}: "arguments" must be a JSON object, not {type(arguments).__name__}'
    return (value["name"], arguments), None


def check_arguments(tools: list[dict], call: ToolCall) -> tuple[dict | None, str | None]:
    """(arguments, None) when `call` names one of `tools` with arguments its schema accepts, else (None, why)."""
    by_name = {tool["function"]["name"]: tool["function"] for tool in tools}
    function = by_name.get(call.function.name)
    if function is None:
        return None, f"unknown tool {call.function.name!r}; the tools are: {', '.join(sorted(by_name))}"
    try:
        arguments = call.function.parsed_arguments()
    except json.JSONDecodeError as error:
        return None, f"arguments of {call.function.name!r} are not JSON: {error.msg}"
    validator = jsonschema.Draft202012Validator(function.get("parameters", {"type": "object"}))
    # Sorted by path so the one problem reported is the same on every run.
    problems = sorted(validator.iter_errors(arguments), key=lambda problem: list(problem.path))
    if problems:
        where = ".".join(str(part) for part in problems[0].path)
        return None, f"bad arguments for {call.function.name!r}{' at ' + where if where else ''}: {problems[0].message}"
    return arguments, None
