"""Fit a judge prompt into the judge's context window by cutting the responses, and say what was cut.

A long agent transcript, or a group of long completions, can make a judge
prompt longer than the judge's `max_model_len`; vLLM then rejects the prompt
and the step would crash. Before a prompt is sent, its tokens are counted (the
judge's own tokenizer; for a remote judge an estimate of one token per three
UTF-8 bytes, since its tokenizer is not on this box) and, over the budget, the
longest responses are cut from the middle (their start and end kept, a line
saying how much was cut in between) until it fits. The cut is recorded
(judge.jsonl and `Judge.stats()["prompts_cut"]`). A prompt that cannot fit even
with every response cut down (a question longer than the window) is not sent:
its responses get the failure score.

The window is `judge.max_prompt_tokens` when the job sets it, else the
engine's: vLLM's max_model_len, or the transformers model's
max_position_embeddings; a remote judge without the key is not bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Remote judges: tokens estimated from UTF-8 bytes (English BPE averages about 4 bytes a token; 3 keeps a margin).
BYTES_PER_TOKEN = 3
# Room kept for the answer's opening after the rendered chat (a group item's prefill is about 10 tokens).
PREFILL_TOKENS = 16
# A response is never cut below this: its start and end stay readable beside the cut line.
MIN_KEPT_CHARS = 64
# Each round doubles the pressure; a prompt still too long after this many is refused, not cut forever.
MAX_ROUNDS = 8


@dataclass(frozen=True)
class WindowCut:
    """What fitting a prompt did: its tokens before and after, and the characters cut from each response."""

    tokens_before: int
    tokens_after: int
    budget: int
    chars_cut: list[int]
    fits: bool

    def to_dict(self) -> dict:
        return {
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "budget": self.budget,
            "chars_cut": self.chars_cut,
            "fits": self.fits,
        }


def token_counter(engine) -> Callable[[str], int]:
    """Tokens of a rendered prompt: the engine's tokenizer, else an estimate from its UTF-8 length."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is not None and callable(tokenizer):
        return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return lambda text: -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def engine_window(engine, configured: int | None) -> int | None:
    """The judge's context window in tokens: the job's judge.max_prompt_tokens, else what the engine says."""
    if configured:
        return configured
    llm = getattr(engine, "llm", None)  # vLLM
    length = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "max_model_len", None)
    if isinstance(length, int):
        return length
    config = getattr(getattr(engine, "model", None), "config", None)  # transformers
    length = getattr(config, "max_position_embeddings", None)
    return length if isinstance(length, int) else None


def cut_middle(text: str, keep: int) -> str:
    """`text` with its middle cut out so that about `keep` characters are left, and a line saying so."""
    if len(text) <= keep:
        return text
    head = keep // 2
    tail = keep - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut to fit the judge's window ...]\n{text[len(text) - tail :]}"


def fit_responses(
    render: Callable[[list[str]], str], responses: list[str], budget: int, count: Callable[[str], int]
) -> tuple[list[str], WindowCut | None]:
    """Responses cut so that `render(responses)` has at most `budget` tokens; None when nothing was cut."""
    before = count(render(responses))
    if before <= budget:
        return responses, None
    current, tokens, pressure = list(responses), before, 1.0
    for _ in range(MAX_ROUNDS):
        lengths = [len(text) for text in current]
        # Characters to drop: the token excess at the responses' share of the prompt, plus a margin.
        excess_chars = int(pressure * (tokens - budget) * sum(lengths) / max(tokens, 1)) + 64
        cap = _water_level(lengths, max(sum(lengths) - excess_chars, 0))
        current = [cut_middle(text, max(cap, MIN_KEPT_CHARS)) for text in current]
        tokens = count(render(current))
        # Every response at its floor (the kept characters and the cut line): cutting more cannot help.
        if tokens <= budget or all(len(text) <= MIN_KEPT_CHARS + 80 for text in current):
            break
        # The prompt outside the responses is denser than they are: cut harder next round.
        pressure *= 2
    chars_cut = [max(len(original) - len(now), 0) for original, now in zip(responses, current)]
    return current, WindowCut(before, tokens, budget, chars_cut, tokens <= budget)


def _water_level(lengths: list[int], total: int) -> int:
    """The largest cap c with sum(min(length, c)) <= total: the longest texts are cut first."""
    low, high = 0, max(lengths, default=0)
    while low < high:  # binary search: the kept total only grows with the cap
        middle = (low + high + 1) // 2
        if sum(min(length, middle) for length in lengths) <= total:
            low = middle
        else:
            high = middle - 1
    return low
