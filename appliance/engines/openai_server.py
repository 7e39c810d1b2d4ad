"""A small OpenAI-compatible server over a local generation engine: /v1/models and /v1/chat/completions.

It serves any `LocalEngine` (transformers or vLLM; a base model, or the
student with its current adapter) with OpenAI's chat completions shapes and
the vLLM extensions the appliance's remote engine uses
(`continue_final_message` / `add_generation_prompt`, `return_token_ids`,
`return_tokens_as_token_ids`). It renders with the engine's own tokenizer and
generates with `engine.generate`, binds loopback (or a given host) only, caps its connections (appliance/http_listener.py),
optionally requires a bearer token, and serialises engine calls (the engines
are not thread-safe). `serve_in_thread` starts it on a free port.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field

from appliance.config.limits import MAX_SEED
from appliance.engines.engine import LocalEngine, Sampling
from appliance.http_listener import ListenerLimits, RunningServer, serve_guarded

# An endpoint serves a few agents of one job: a generation runs at a time, the rest wait in line.
# A body holds a chat request or a submission of trajectory groups (the daemon forwards up to its
# MAX_TRAJECTORY_BODY_BYTES, the same bound): nothing larger is read, whatever the token holder sends.
ENDPOINT_LIMITS = ListenerLimits(total=256, per_peer=64, max_body_bytes=16 * 2**20)


class ChatMessage(BaseModel):
    # OpenAI clients send fields this server has no use for (name, refusal, ...): ignored, not refused.
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant messages (OpenAI shape)
    tool_call_id: str | None = None  # tool messages


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=64)  # bounded: a request's n completions are one engine call under the lock
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)  # what every engine's RNG takes, not a 400 from torch
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)  # OpenAI's own maximum
    stream: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    tools: list[dict[str, Any]] | None = None  # OpenAI function tools; needs ChatHooks
    tool_choice: Any = None  # accepted for compatibility; the model always chooses ("auto")


@dataclass(frozen=True)
class SamplingPolicy:
    """The sampling a job trains on: an endpoint with a policy serves with exactly this and refuses other asks;
    a longer max_tokens than the job's is served at the job's bound (and ends "length" there)."""

    temperature: float
    top_p: float
    stop: tuple[str, ...] = ()
    # The job's bound on a turn (grpo.max_new_tokens): a request asking for more is served at most this many.
    max_tokens: int | None = None
    # The job's bound on a whole sequence (its memory plan's): a longer prompt is refused before the engine sees
    # it, and a reply is served at most up to the bound.
    max_sequence_tokens: int | None = None
    # The job's group size: completions of one request are one engine batch, and the plan budgets a group's.
    max_n: int | None = None

    def refusal(self, request: "ChatRequest") -> str | None:
        """Why `request` asks for other sampling than the job's, or None."""
        asked = request.model_fields_set  # only values the client sent are checked; defaults are not asks
        stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
        if ("temperature" in asked and request.temperature != self.temperature) or (
            "top_p" in asked and request.top_p != self.top_p
        ):
            return (
                f"this job samples at temperature {self.temperature} and top_p {self.top_p} (what it trains on);"
                f" the request asks temperature {request.temperature} and top_p {request.top_p}: drop them or send"
                " the job's values"
            )
        if self.max_n is not None and request.n > self.max_n:
            return f"this job's groups are {self.max_n} completions (its memory plan); the request asks n={request.n}"
        if "stop" in asked and stop and stop != self.stop:
            return (
                f"this job's stop strings are {list(self.stop)}; the request asks {list(stop)}: a stop string would"
                " cut the text but not the sampled tokens, so drop `stop` and cut the reply in your own code"
            )
        return None


class _ServiceClosed(Exception):
    """The endpoint's owner stopped serving the model."""


class ChatHooks(Protocol):
    """What a server with tool calls and a ledger adds (see agents/external_source.py).

    The hooks render `tools` and tool messages into the prompt, read tool calls out of each reply and record what
    was served; a server without hooks refuses requests that carry tools.
    """

    def template(self, messages: list[dict], tools: list[dict]) -> list[dict[str, str]]:
        """The request's messages as `{role, content}` dicts for the chat template, tools described."""

    def reply(self, prompt_ids: list[int], completion, call_id_prefix: str) -> dict[str, Any]:
        """Fields to merge into the choice's message (tool_calls) and choice (finish_reason); records it served."""

    def routes(self, app) -> None:
        """Add routes to the FastAPI app (behind the same bearer token)."""


class TokenLogprobs:
    """Raw per-position log-probabilities of a completion under a transformers model.

    Without a scorer `logprobs` are those the engine sampled with (what a trajectory trains on). With one
    (`serve_in_thread` over a transformers model) they are the model's raw next-token distribution at each
    generated position, with `top_logprobs` as vLLM's own server returns them, from one forward pass.
    """

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    @torch.no_grad()
    def content(self, prompt_ids: list[int], token_ids: list[int], top: int, as_ids: bool) -> list[dict]:
        if not token_ids:
            return []
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt_ids + token_ids], device=device)
        was_training = self.model.training
        self.model.eval()
        try:
            # The logits before each generated token: from the prompt's last position to the second-to-last
            # token's; the last position predicts past the completion and is dropped.
            logits = self.model(input_ids=ids, logits_to_keep=len(token_ids) + 1).logits[0, :-1].float()
        finally:
            self.model.train(was_training)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, torch.tensor(token_ids, device=device).unsqueeze(1)).squeeze(1).tolist()
        best = torch.topk(logprobs, top, dim=-1) if top else None
        entries = []
        for position, (token_id, logprob) in enumerate(zip(token_ids, chosen)):
            text = token_text(self.tokenizer, token_id, as_ids)
            alternatives = []
            if best is not None:
                for alt_id, alt_logprob in zip(best.indices[position].tolist(), best.values[position].tolist()):
                    alt_text = token_text(self.tokenizer, alt_id, as_ids)
                    alternatives.append({"token": alt_text, "logprob": alt_logprob, "bytes": list(alt_text.encode())})
            entries.append(
                {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": alternatives}
            )
        return entries


def token_text(tokenizer, token_id: int, as_id: bool) -> str:
    return f"token_id:{token_id}" if as_id else tokenizer.decode([token_id])


class ChatService:
    """The endpoint's logic over one engine, independent of the HTTP framework."""

    def __init__(
        self,
        engine: LocalEngine,
        served_name: str,
        hooks: ChatHooks | None = None,
        scorer: TokenLogprobs | None = None,
        policy: SamplingPolicy | None = None,
    ):
        self.engine, self.policy = engine, policy
        self.served_name = served_name
        self.hooks, self.scorer = hooks, scorer
        # Held around every engine call; a trainer sharing the engine holds it while it updates the weights.
        self.lock = threading.Lock()
        self.open = True  # False once the owner stops serving: requests waiting for the lock get 503

    def _messages(self, request: ChatRequest) -> list[dict]:
        messages = [message.model_dump(exclude_none=True) for message in request.messages]
        if self.hooks is not None:
            return self.hooks.template(messages, request.tools or [])
        if request.tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            raise ValueError("this endpoint does not serve tool calls (no tools, tool messages or tool_calls)")
        return [{"role": m["role"], "content": m.get("content") or ""} for m in messages]

    def render(self, request: ChatRequest) -> str:
        messages = self._messages(request)
        if request.continue_final_message:
            if messages[-1]["role"] != "assistant":
                raise ValueError("continue_final_message needs the last message to be the assistant's")
            return self.engine.tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
        return self.engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=request.add_generation_prompt
        )

    def complete(self, request: ChatRequest) -> dict:
        if request.continue_final_message and request.add_generation_prompt:
            raise ValueError("set add_generation_prompt false with continue_final_message (as vLLM requires)")
        if request.stream:
            raise ValueError("streaming is not supported by this server; send stream: false")
        refusal = self.policy.refusal(request) if self.policy is not None else None
        if refusal is not None:
            raise ValueError(refusal)
        # Rendered and checked before the lock: a bad request never waits behind a generation.
        prompt = self.render(request)
        sampling, stop = self._sampling(request, self._room(prompt))
        # Under a policy the text keeps the stop string: the served text is always the sampled tokens' text.
        trim = self.policy is None and stop and not request.include_stop_str_in_output
        request_id = uuid.uuid4().hex
        with self.lock:
            if not self.open:
                raise _ServiceClosed("the model is no longer served here (the job is ending)")
            completions = self.engine.generate([prompt], sampling)[0]
            if trim:
                completions = [_without_stop(completion, stop) for completion in completions]
            logprobs = [self._logprobs(request, c) if request.logprobs else None for c in completions]
            extras = [
                self.hooks.reply(c.prompt_token_ids, c, f"call_{request_id[:12]}_{index}")
                if self.hooks is not None
                else {}
                for index, c in enumerate(completions)
            ]
        return self._document(request, request_id, completions, logprobs, extras)

    def _room(self, prompt: str) -> int | None:
        """Tokens left for the reply under the policy's sequence bound (None: no bound); ValueError when none."""
        bound = self.policy.max_sequence_tokens if self.policy is not None else None
        if bound is None:
            return None
        tokens = len(self.engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if tokens >= bound:
            raise ValueError(
                f"the prompt is {tokens} tokens and this job's sequences are at most {bound} (its memory plan); "
                "shorten the conversation"
            )
        return bound - tokens

    def _sampling(self, request: ChatRequest, room: int | None = None) -> tuple[Sampling, tuple[str, ...]]:
        """The request's sampling (a policy fixes temperature, top-p and stop), and its own stop strings."""
        stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
        asked = request.max_completion_tokens or request.max_tokens
        bound = self.policy.max_tokens if self.policy is not None else None
        bound = min(bound, room) if bound is not None and room is not None else bound or room
        sampling = Sampling(
            max_new_tokens=min(asked or bound or 256, bound or asked or 256),
            n=request.n,
            temperature=request.temperature if self.policy is None else self.policy.temperature,
            top_p=request.top_p if self.policy is None else self.policy.top_p,
            seed=request.seed,
            stop=stop if self.policy is None else self.policy.stop,
        )
        return sampling, stop

    def _document(self, request: ChatRequest, request_id: str, completions, logprobs, extras) -> dict:
        """The chat.completion response for the completions of one request."""
        prompt_ids = completions[0].prompt_token_ids
        choices = []
        for index, (completion, content, extra) in enumerate(zip(completions, logprobs, extras)):
            choice = {
                "index": index,
                "message": {"role": "assistant", "content": completion.text, **extra.get("message", {})},
                "logprobs": {"content": content} if content is not None else None,
                "finish_reason": extra.get("finish_reason", completion.finish_reason),
            }
            if request.return_token_ids:
                choice["token_ids"] = completion.token_ids
            choices.append(choice)
        generated = sum(len(c.token_ids) for c in completions)
        document = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": generated,
                "total_tokens": len(prompt_ids) + generated,
            },
        }
        if request.return_token_ids:
            document["prompt_token_ids"] = prompt_ids
        return document

    def _logprobs(self, request: ChatRequest, completion) -> list[dict]:
        as_ids = request.return_tokens_as_token_ids
        if self.scorer is not None:
            return self.scorer.content(
                completion.prompt_token_ids, completion.token_ids, request.top_logprobs or 0, as_ids
            )
        entries = []
        for token_id, logprob in zip(completion.token_ids, completion.logprobs):
            text = token_text(self.engine.tokenizer, token_id, as_ids)
            entries.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
        return entries


def _without_stop(completion, stop: tuple[str, ...]):
    """The completion's text without the stop string it ended on (OpenAI's default)."""
    for text in stop:
        if completion.text.endswith(text):
            completion.text = completion.text[: -len(text)]
            completion.finish_reason = "stop"
            break
    return completion


def build_app(service: ChatService, token: str | None = None):
    """The FastAPI app: OpenAI error bodies, bearer-token check when a token is set."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title="appliance OpenAI-compatible endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    @app.middleware("http")
    async def authorize(request: Request, call_next):
        if token is not None:
            offered = request.headers.get("authorization", "")
            # Constant-time comparison: the answer's timing says nothing about how much of the token matched.
            if not secrets.compare_digest(offered.encode(), f"Bearer {token}".encode()):
                return error(401, "missing or wrong bearer token", "authentication_error")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return error(400, f"{where}: {first.get('msg')}")

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": service.served_name, "object": "model", "owned_by": "appliance"}]}

    @app.post("/v1/chat/completions")
    def chat(request: ChatRequest):
        if request.model != service.served_name:
            return error(
                404, f"model '{request.model}' is not served here (serving '{service.served_name}')", "not_found_error"
            )
        try:
            return service.complete(request)
        except ValueError as exc:
            return error(400, str(exc))
        except _ServiceClosed as exc:
            return error(503, str(exc), "service_unavailable")

    if service.hooks is not None:
        service.hooks.routes(app)
    return app


def serve_in_thread(
    engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None, served_name: str | None = None
) -> RunningServer:
    """Serve transformers engine `engine` (an HFEngine: raw logprobs with top_logprobs) on host:port (0: a free
    port) in a background thread; returns once it accepts."""
    service = ChatService(engine, served_name or engine.name, scorer=TokenLogprobs(engine.model, engine.tokenizer))
    return serve_app_in_thread(build_app(service, token), host, port)


def serve_app_in_thread(app, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Serve an ASGI `app` on host:port (0: a free port) under the endpoint's connection caps
    (appliance/http_listener.py); returns once it accepts. Its URL ends in /v1."""
    running = serve_guarded(app, host, port, ENDPOINT_LIMITS, name="endpoint")
    running.url += "/v1"
    return running
