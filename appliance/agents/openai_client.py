"""A ChatClient over an OpenAI-compatible endpoint (the `openai` package): environments roll out against a job's endpoint.

This is what agent code outside the job uses: an environment's `rollout`
plays against `OpenAIChatClient`, which sends the conversation (OpenAI shape,
tools included) to `/v1/chat/completions` asking for token ids and logprobs
(vLLM's `return_token_ids` extension), and keeps what was sampled on the turn
(`sampled`), so the trajectory can be submitted to the job and passes its
served-token check. Tool calls come back as the endpoint parsed them; calls
it could not read become the environment's error messages, as in process.

`openai` is imported when a client is built: the appliance itself does not need it.
"""

from __future__ import annotations

from typing import Any

from appliance.agents.environment import AssistantTurn
from appliance.agents.toolcalls import parse_tool_calls
from appliance.agents.trajectory import AssistantMessage, FunctionCall, Message, Sampled, ToolCall


def openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Trajectory messages as a chat-completions `messages` list (assistant turns keep their whole text)."""
    out = []
    for message in messages:
        data = message.model_dump(exclude={"sampled", "error"}, exclude_none=True)
        if isinstance(message, AssistantMessage) and not message.tool_calls:
            data.pop("tool_calls", None)
        out.append(data)
    return out


class OpenAIChatClient:
    """`chat(messages, tools)` against an OpenAI-compatible server that returns token ids and logprobs."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        max_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        timeout: float = 600.0,
        client: Any = None,
    ):
        if client is None:
            from openai import AsyncOpenAI

            # No retries: a failed call reaches the environment rather than silently sampling another reply.
            client = AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)
        self.client, self.model = client, model
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p
        self.latencies: list[float] = []  # seconds per chat call, for measurements
        self.completion_tokens = 0

    async def chat(self, messages: list[Message], tools: list[dict]) -> AssistantTurn:
        import time

        started = time.monotonic()
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=openai_messages(messages),
            tools=tools or None,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            logprobs=True,
            extra_body={"return_token_ids": True},  # vLLM's extension: the ids the job's ledger checks
        )
        self.latencies.append(time.monotonic() - started)
        choice = response.choices[0]
        extra = choice.model_extra or {}
        token_ids = extra.get("token_ids")
        prompt_ids = (response.model_extra or {}).get("prompt_token_ids")
        if token_ids is None or prompt_ids is None or choice.logprobs is None:
            raise RuntimeError(
                f"{self.client.base_url} returned no token ids or logprobs; the trajectory could not"
                " be trained (use an endpoint with vLLM's return_token_ids, e.g. a job's endpoint)"
            )
        self.completion_tokens += len(token_ids)
        text = choice.message.content or ""
        calls = [
            ToolCall(id=call.id, function=FunctionCall(name=call.function.name, arguments=call.function.arguments))
            for call in choice.message.tool_calls or []
        ]
        return AssistantTurn(
            text=text,
            tool_calls=calls,
            tool_call_errors=parse_tool_calls(text).errors,
            sampled=Sampled(
                token_ids=list(token_ids),
                logprobs=[entry.logprob for entry in choice.logprobs.content],
                prompt_token_ids=list(prompt_ids),
                # "tool_calls" ends a turn as a stop does; only "length" means the reply was cut.
                finish_reason="length" if choice.finish_reason == "length" else "stop",
            ),
        )

    async def close(self) -> None:
        await self.client.close()
