"""Rule rewards: pure functions of one completion, `fn(prompt, completion, reference, metadata, **params) -> float`.

They follow the layered GSM8K GRPO recipes (willccbb's gist, the AtomicGPT
study): a correctness reward carries the signal, small format rewards teach
the `<reasoning>...</reasoning><answer>...</answer>` layout first. Each
returns its full value for a perfect completion (1.0 unless said otherwise);
the job file's weights set how much each counts. Every rule reads the
completion's folded form (fold.py), as the judge's guard does, and no text
makes a rule raise: a degenerate sample scores what its text earns.
"""

from __future__ import annotations

import re

from appliance.rewards.extract import NUMBER, answers_match, extract_value
from appliance.rewards.fold import fold

# Strict: each tag on its own line, as the recipes' system prompt shows it. Soft: the two blocks in order, any
# spacing; the softer reward is what a small model earns first.
_STRICT_LAYOUT = re.compile(r"<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\s*", re.DOTALL)
_SOFT_LAYOUT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SINGLE_NUMBER = re.compile(rf"\s*(?:{NUMBER.pattern})\s*")

# The character count per token of English text in BPE vocabularies (rule of thumb).
CHARACTERS_PER_TOKEN = 4


def correctness(prompt: str, completion: str, reference: str | None, metadata: dict) -> float:
    """1.0 when the completion's final number equals the reference's, else 0.0 (also without a reference)."""
    if reference is None:
        return 0.0
    return 1.0 if answers_match(completion, reference) else 0.0


def strict_format(prompt: str, completion: str, reference: str | None, metadata: dict) -> float:
    """1.0 when the whole completion is exactly

    <reasoning>
    ...
    </reasoning>
    <answer>
    ...
    </answer>

    with only whitespace after the closing tag; else 0.0.
    """
    return 1.0 if _STRICT_LAYOUT.fullmatch(fold(completion)) else 0.0


def soft_format(prompt: str, completion: str, reference: str | None, metadata: dict) -> float:
    """1.0 when a <reasoning> block is followed by an <answer> block anywhere in the completion."""
    return 1.0 if _SOFT_LAYOUT.search(fold(completion)) else 0.0


def answer_format(prompt: str, completion: str, reference: str | None, metadata: dict) -> float:
    """1.0 for exactly one <answer>N</answer> holding one number and nothing but whitespace after it.

    The short layout of the multiply demo: any reasoning may come before the block.
    """
    completion = fold(completion)
    if completion.count("<answer>") != 1 or completion.count("</answer>") != 1:  # several answers: none counts
        return 0.0
    block = _ANSWER_BLOCK.search(completion)
    if block is None or completion[block.end() :].strip():
        return 0.0
    return 1.0 if _SINGLE_NUMBER.fullmatch(block.group(1)) else 0.0


def int_answer(prompt: str, completion: str, reference: str | None, metadata: dict) -> float:
    """0.5 when the extracted answer is a whole number ("72", "72.0", "1,000"), else 0.0 (recipe value)."""
    value = extract_value(completion)
    return 0.5 if value is not None and value.denominator == 1 else 0.0


def xmlcount(prompt: str, completion: str, reference: str | None, metadata: dict) -> float:
    """0.125 for each of the four tags on its own line, minus 0.001 per character of text after </answer>.

    As in willccbb's recipe, with two fixes: trailing whitespace is free (a
    completion that stops right after </answer> is not penalised), and text
    after </answer> is counted once, not once per tag.
    """
    completion = fold(completion)
    score = 0.0
    if completion.count("<reasoning>\n") == 1:
        score += 0.125
    if completion.count("\n</reasoning>\n") == 1:
        score += 0.125
    if completion.count("\n<answer>\n") == 1:
        score += 0.125
    if completion.count("\n</answer>") == 1:
        score += 0.125
        trailing = completion.split("\n</answer>", 1)[1].strip()  # text after the answer: rambling, penalised
        score -= 0.001 * len(trailing)
    return score


def length(prompt: str, completion: str, reference: str | None, metadata: dict, target: int | float) -> float:
    """0.0 up to `target` tokens, then linear down to -1.0 at 2 x target (and -1.0 beyond).

    Tokens are metadata["completion_tokens"] when the step loop supplies the
    real count, else the character count / 4 (CHARACTERS_PER_TOKEN).
    """
    if target <= 0:
        raise ValueError(f"length: target must be a positive number of tokens, got {target}")
    tokens = metadata.get("completion_tokens")
    if not isinstance(tokens, int):
        tokens = len(completion) / CHARACTERS_PER_TOKEN
    excess = (tokens - target) / target  # 0 at the target, 1 at twice it
    return -min(1.0, max(0.0, excess))


RULES = {
    "correctness": correctness,
    "strict_format": strict_format,
    "soft_format": soft_format,
    "answer_format": answer_format,
    "int": int_answer,
    "xmlcount": xmlcount,
    "length": length,
}


def format_compliant(completion: str) -> bool:
    """True when an <answer>...</answer> block holding a number is present (eval's "format compliance")."""
    return any(NUMBER.search(block) for block in _ANSWER_BLOCK.findall(fold(completion)))
