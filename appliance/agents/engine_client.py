"""The in-process chat client: rollouts talk to a GenerationEngine (HFEngine, vLLM) in this process.

`chat` renders the conversation with the engine's chat template (tools
described in the system prompt, `toolcalls.template_messages`), and the call
waits for a shared batcher: every rollout of a step that is waiting for the
model at that moment goes into one `engine.generate` call (run in a worker
thread so the event loop keeps serving tools), so concurrent rollouts are
batched by the engine. The reply keeps the sampled token ids, their logprobs
and the prompt ids, so the trajectory trains exactly as it was generated.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

from appliance.agents.environment import AssistantTurn
from appliance.agents.toolcalls import parse_tool_calls, template_messages
from appliance.agents.trajectory import Message, Sampled
from appliance.engines.engine import Completion, GenerationEngine, Sampling


class EngineChatClient:
    """A ChatClient over a GenerationEngine; one instance serves every concurrent rollout of a step."""

    def __init__(self, engine: GenerationEngine, sampling: Sampling, max_batch_size: int = 64):
        if sampling.n != 1:
            raise ValueError("EngineChatClient samples one reply per chat call; set Sampling.n to 1")
        self.engine, self.sampling, self.max_batch_size = engine, sampling, max_batch_size
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self._calls = itertools.count(1)
        self._turns = itertools.count(1)
        self.batch_sizes: list[int] = []  # one entry per engine.generate call, for metrics and tests

    async def chat(self, messages: list[Message], tools: list[dict]) -> AssistantTurn:
        prompt = self.engine.render_chat(template_messages(messages, tools))
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, future))
        # One drainer at a time: prompts queued while it generates go into its next batch.
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        completion: Completion = await future
        parsed = parse_tool_calls(completion.text, call_id_prefix=f"call_{next(self._turns)}")
        return AssistantTurn(
            text=completion.text,
            tool_calls=parsed.calls,
            tool_call_errors=parsed.errors,
            sampled=Sampled(
                token_ids=completion.token_ids,
                logprobs=completion.logprobs,
                prompt_token_ids=completion.prompt_token_ids,
                finish_reason=completion.finish_reason,
            ),
        )

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let every rollout that is ready queue its prompt first
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch_size], self._pending[self.max_batch_size :]
            sampling = self.sampling
            if sampling.seed is not None:  # a fresh, reproducible seed per call, not the same draw every time
                sampling = replace(sampling, seed=sampling.seed + next(self._calls))
            self.batch_sizes.append(len(batch))
            try:
                results = await asyncio.to_thread(self.engine.generate, [prompt for prompt, _ in batch], sampling)
            except Exception as error:  # every waiting rollout sees the engine's failure
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), completions in zip(batch, results):
                if not future.done():  # a rollout cancelled meanwhile has no one waiting for its reply
                    future.set_result(completions[0])
