"""A generation engine on another box: an OpenAI-compatible server (vLLM serve) over HTTP.

The one place the appliance connects off the box, and only to the URL the job
file names: the HTTP client ignores proxy variables and follows no redirects.
The bearer token is read from a file and never written to a log or an error.

Prompts cross the engine interface as rendered text, but a remote model's
chat template is the server's business; so `render_chat` returns the messages
in an envelope (`ENVELOPE`-delimited JSON) and any text appended after it (the
judge's answer prefill) is sent as the start of the assistant's reply with
vLLM's `continue_final_message`. Requests run `concurrency` at a time, each
with a timeout, retried with backoff on connection errors, timeouts and 5xx.
A request that still fails is not fatal: its completion comes back with
`finish_reason` "timeout" or "error" and the reason in `error`, and the judge
counts it as an outcome.
"""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from appliance.engines.engine import Completion, EngineCounters, Sampling, UnansweredLogprobs
from appliance.errors import ApplianceError

ENVELOPE = "\x00"  # json.dumps escapes NUL, so it never occurs inside the JSON
TOP_LOGPROBS = 20  # the most alternatives OpenAI's API returns per position
# Answers that say "not now" rather than "not this request": timeout, rate limit, and the server's own faults.
RETRY_STATUSES = {408, 429, 500, 502, 503, 504}


class RemoteEngineError(ApplianceError):
    """The endpoint cannot be used at all (bad URL, unreadable token file); the message says what to change."""


class _Failure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" | "error"


def check_endpoint(url: str) -> str:
    """The base URL (".../v1") without a trailing slash, or RemoteEngineError saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteEngineError(f"judge endpoint '{url}' is not an http(s) URL like http://judge.lab:8000/v1")
    if parts.username or parts.password:
        raise RemoteEngineError(f"judge endpoint '{url}' carries credentials; put the token in token_file instead")
    return url.rstrip("/")


def read_token(token_file: str | Path | None) -> str | None:
    if token_file is None:
        return None
    try:
        token = Path(token_file).read_text().strip()
    except OSError as error:
        raise RemoteEngineError(
            f"token_file {token_file} cannot be read ({error.strerror}); "
            "give a readable file holding the endpoint's API key"
        ) from None
    if not token:
        raise RemoteEngineError(f"token_file {token_file} is empty; put the endpoint's API key in it")
    return token


def split_prompt(prompt: str) -> tuple[list[dict], str]:
    """(messages, assistant prefill) from a prompt built by `render_chat(messages) + prefill`."""
    if not prompt.startswith(ENVELOPE) or ENVELOPE not in prompt[1:]:
        raise ValueError("the remote engine takes prompts made by its own render_chat (chat messages), not raw text")
    end = prompt.index(ENVELOPE, 1)
    return json.loads(prompt[1:end]), prompt[end + 1 :]


class OpenAIRemoteEngine:
    """GenerationEngine over an OpenAI-compatible /v1/chat/completions endpoint."""

    kind = "remote"
    samples_like_trainer = False

    def __init__(
        self,
        endpoint: str,
        model: str,
        token: str | None = None,
        timeout_seconds: float = 60.0,
        concurrency: int = 4,
        retries: int = 2,
        backoff_seconds: float = 0.5,
        chat_template_kwargs: dict | None = None,
    ):
        import httpx

        self.endpoint = check_endpoint(endpoint)
        self.name = model
        self.concurrency = max(1, concurrency)
        self.retries = max(0, retries)
        self.backoff_seconds = backoff_seconds
        self.counters = EngineCounters()
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.failures = {"timeout": 0, "error": 0}  # requests that failed after their retries, for the judge's totals
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # trust_env=False: no proxy from the environment, so the only host reached is the configured one.
        self._client = httpx.Client(
            base_url=self.endpoint,
            headers=headers,
            timeout=timeout_seconds,
            trust_env=False,
            follow_redirects=False,  # a redirect could carry the bearer token to another host
            limits=httpx.Limits(max_connections=self.concurrency),
        )
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="remote-engine")

    @classmethod
    def from_judge_spec(cls, spec) -> "OpenAIRemoteEngine":
        return cls(
            spec.endpoint,
            spec.model,
            token=read_token(spec.token_file),
            timeout_seconds=spec.request_timeout_seconds,
            concurrency=spec.concurrency,
            retries=spec.retries,
            chat_template_kwargs=spec.chat_template_kwargs,
        )

    def __repr__(self) -> str:  # never shows the token
        return f"OpenAIRemoteEngine({self.endpoint!r}, model={self.name!r})"

    # ----- the GenerationEngine interface ---------------------------------------------------------

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return ENVELOPE + json.dumps(messages, ensure_ascii=False) + ENVELOPE

    def generate(self, prompts: list[str], sampling: Sampling) -> list[list[Completion]]:
        started = time.monotonic()
        bodies = [self._body(prompt, sampling) for prompt in prompts]
        results = list(self._pool.map(self._complete, range(len(prompts)), bodies, [sampling.n] * len(prompts)))
        self.counters.generate_seconds += time.monotonic() - started
        self.counters.calls += 1
        return results

    def next_token_logprobs(self, prompts: list[str], candidates: list[str]) -> list[dict[str, float]]:
        """log p(candidate) as the next token after each prompt, from the endpoint's top logprobs.

        A candidate outside the endpoint's top `TOP_LOGPROBS` gets -inf (its probability is below every
        listed one, small by construction). A prompt whose request failed gets an `UnansweredLogprobs`.
        """
        # One greedy token: the answer is the alternatives listed at that position, not the token itself.
        sampling = Sampling(max_new_tokens=1, temperature=0.0)
        bodies = [{**self._body(prompt, sampling), "top_logprobs": TOP_LOGPROBS} for prompt in prompts]
        readings = []
        for top in self._pool.map(self._top_logprobs, bodies):
            if isinstance(top, UnansweredLogprobs):
                readings.append(top)
            else:
                readings.append({candidate: top.get(candidate, float("-inf")) for candidate in candidates})
        return readings

    def top_next_tokens(self, prompt: str, count: int = 5) -> list[tuple[str, float]]:
        """The endpoint's `count` most likely next tokens after `prompt`, with probabilities (for a diagnosis)."""
        body = {**self._body(prompt, Sampling(max_new_tokens=1, temperature=0.0)), "top_logprobs": TOP_LOGPROBS}
        top = self._top_logprobs(body)
        ranked = sorted(top.items(), key=lambda item: -item[1])[:count]
        return [(token, math.exp(logprob)) for token, logprob in ranked]

    def _top_logprobs(self, body: dict) -> dict[str, float]:
        try:
            document = self._post_with_retries(body)
            first = document["choices"][0]["logprobs"]["content"][0]
            self._count((document.get("usage") or {}).get("prompt_tokens") or 0, 0)
            top: dict[str, float] = {}
            for alternative in first["top_logprobs"]:
                # Several byte-level tokens can decode to the same text: keep the most probable.
                top.setdefault(alternative["token"], float(alternative["logprob"]))
            return top
        except _Failure as failure:
            self.failures[failure.kind] += 1
            return UnansweredLogprobs(failure.kind, str(failure))
        except (KeyError, IndexError, TypeError, ValueError):
            self.failures["error"] += 1
            return UnansweredLogprobs(
                "error", f"{self.endpoint} answered with a malformed completion (no next-token top logprobs)"
            )

    def metrics_snapshot(self) -> dict | None:
        return None  # the endpoint's own metrics live on its box; requests and failures are counted here

    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        raise NotImplementedError("a remote endpoint serves its own weights; it takes no adapter from this box")

    # The endpoint's memory is its own box's: there is nothing here to sleep or wake.
    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    # ----- requests --------------------------------------------------------------------------------

    def _body(self, prompt: str, sampling: Sampling) -> dict:
        messages, prefill = split_prompt(prompt)
        body = {
            "model": self.name,
            "messages": messages + ([{"role": "assistant", "content": prefill}] if prefill else []),
            "max_tokens": sampling.max_new_tokens,
            "n": sampling.n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": True,
            # vLLM extensions (an OpenAI server ignores them): continue the prefill, return token ids.
            "return_token_ids": True,
        }
        if prefill:
            # The prefill is an unfinished assistant turn: the template must not open a new one after it.
            body.update(add_generation_prompt=False, continue_final_message=True)
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs  # vLLM: e.g. Qwen3's enable_thinking
        if sampling.stop:
            # Kept in the text, as the local engines keep it (vLLM's include_stop_str_in_output).
            body.update(stop=list(sampling.stop), include_stop_str_in_output=True)
        if sampling.regex:
            body["structured_outputs"] = {"regex": sampling.regex}  # vLLM's constrained decoding
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def _complete(self, index: int, body: dict, n: int) -> list[Completion]:
        try:
            document = self._post_with_retries(body)
            return self._parse(index, document, n)
        except _Failure as failure:
            self.failures[failure.kind] += 1
            return [
                Completion(
                    prompt_index=index,
                    prompt_token_ids=[],
                    token_ids=[],
                    text="",
                    logprobs=[],
                    finish_reason=failure.kind,
                    error=str(failure),
                )
                for _ in range(n)
            ]

    def _post_with_retries(self, body: dict) -> dict:
        import httpx

        last: _Failure | None = None
        for attempt in range(self.retries + 1):
            if attempt:  # exponential backoff: a busy server gets more room at each retry
                time.sleep(self.backoff_seconds * 2 ** (attempt - 1))
            try:
                response = self._client.post("/chat/completions", json=body)
            except httpx.TimeoutException:
                last = _Failure("timeout", f"no answer from {self.endpoint} within the request timeout")
                continue
            except httpx.HTTPError as error:
                last = _Failure("error", f"{self.endpoint} unreachable: {type(error).__name__}")
                continue
            if response.status_code in RETRY_STATUSES:
                last = _Failure("error", f"{self.endpoint} answered HTTP {response.status_code}")
                continue
            if response.status_code != 200:
                # 4xx other than the retried ones: the request itself is wrong; asking again will not help.
                raise _Failure("error", f"{self.endpoint} answered HTTP {response.status_code}: {response.text[:200]}")
            try:
                return response.json()
            except ValueError:
                raise _Failure(
                    "error", f"{self.endpoint} answered with a body that is not JSON: {response.text[:120]!r}"
                ) from None
        assert last is not None
        raise last

    def _parse(self, index: int, document: dict, n: int) -> list[Completion]:
        try:
            # The index, not the list order, says which sample a choice is.
            choices = sorted(document["choices"], key=lambda choice: choice.get("index", 0))
            if len(choices) != n:
                raise ValueError(f"{len(choices)} choices for n={n}")
            usage = document.get("usage") or {}
            prompt_ids = [int(t) for t in document.get("prompt_token_ids") or []]
            completions = [self._completion(index, choice, prompt_ids) for choice in choices]
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise _Failure("error", f"{self.endpoint} answered with a malformed completion ({error})") from None
        self._count(
            usage.get("prompt_tokens") or len(prompt_ids),
            usage.get("completion_tokens") or sum(len(c.token_ids) for c in completions),
        )
        return completions

    def _count(self, prompt_tokens, generated_tokens) -> None:
        with self._lock:  # requests finish on the pool's threads
            self.counters.prompt_tokens += int(prompt_tokens)
            self.counters.generated_tokens += int(generated_tokens)

    @staticmethod
    def _completion(index: int, choice: dict, prompt_ids: list[int]) -> Completion:
        text = choice["message"]["content"]
        if not isinstance(text, str):
            raise ValueError("message content is not text")
        content = ((choice.get("logprobs") or {}).get("content")) or []
        token_ids = [int(t) for t in choice.get("token_ids") or []]
        return Completion(
            prompt_index=index,
            prompt_token_ids=prompt_ids,
            token_ids=token_ids,
            text=text,
            logprobs=[float(entry["logprob"]) for entry in content],
            # Anything but a stop (length, content filter, an unknown reason) is treated as cut off.
            finish_reason="stop" if choice.get("finish_reason") == "stop" else "length",
        )
