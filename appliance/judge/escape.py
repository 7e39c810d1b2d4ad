"""Escape a judged text so that no part of it is read as a special token by the judge's tokenizer.

A tokenizer matches its added tokens (`<|im_end|>`, `<end_of_turn>`, `</s>`,
`[INST]`, ...) anywhere in the text it encodes, so a response that contains one
could end the judge's user turn and write the judge's answer itself. Every such
token in a response is broken with a word joiner (U+2060) after its first
character and before its last: a reader sees the same text, the tokenizer sees
ordinary characters.

Which strings are escaped: every added token of the judge's own tokenizer that
looks like markup or is flagged special (`tokenizer_tokens`), plus the control
token families of the common chat templates (`FAMILY_PATTERNS`), because a
remote judge's tokenizer is not known on this box and a local one may be
swapped for another. The escape is repeated until no token is left (breaking
one occurrence can never form another, but overlapping occurrences need a
second pass).
"""

from __future__ import annotations

import re
from typing import Iterable

WORD_JOINER = "\u2060"
FULLWIDTH_BAR = "\uff5c"  # DeepSeek's <｜begin▁of▁sentence｜>

# The control-token families of common chat templates, for judges whose tokenizer this box cannot see.
FAMILY_PATTERNS = (
    r"<\|[^\n<>]{0,64}?\|>",  # ChatML, Llama 3, Phi, Granite, Command-R: <|im_end|>, <|eot_id|>
    rf"<{FULLWIDTH_BAR}[^\n<>]{{0,64}}?{FULLWIDTH_BAR}>",  # DeepSeek: <｜end▁of▁sentence｜>
    r"(?i:</?(?:s|unk|pad|eos|bos|mask|sep|cls|sop|eop|start_of_turn|end_of_turn|start_of_image|end_of_image"
    r"|think|tool_call|tool_response|tool_calls|tools|im_start|im_end|endoftext)>)",  # Llama 2, Gemma, Qwen
    r"\[/?[A-Z][A-Z_]{1,31}\]",  # Mistral: [INST], [/INST], [TOOL_CALLS], [AVAILABLE_TOOLS]
    r"\[gMASK\]",  # GLM
    r"<</?SYS>>",  # Llama 2's system block
    r"<extra_id_\d+>",  # T5
)
# An added token that looks like markup (<...> or [...]) is escaped even when the tokenizer does not flag it special.
_MARKUP = re.compile(r"^[<\[].*[>\]]$", re.DOTALL)
# Overlapping tokens need a second pass; more than a few means a text built to defeat the escape.
MAX_PASSES = 8


def tokenizer_tokens(tokenizer) -> list[str]:
    """The added tokens of a transformers tokenizer that a text could spell: special, or markup-shaped."""
    if tokenizer is None:
        return []
    found: set[str] = set(getattr(tokenizer, "all_special_tokens", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for token in decoder.values():
        content = getattr(token, "content", str(token))
        if getattr(token, "special", False) or _MARKUP.match(content):
            found.add(content)
    # One character cannot be split; whitespace-only tokens are text.
    return sorted(t for t in found if len(t) >= 2 and t.strip() and WORD_JOINER not in t)


class TokenEscaper:
    """Escapes the given token strings and the common families in a text; `escape(text)`."""

    def __init__(self, tokens: Iterable[str] = ()):
        # Longest first: the regex alternation takes the first that matches, and a long token may contain a short one.
        literals = sorted({t for t in tokens if len(t) >= 2}, key=len, reverse=True)
        alternatives = [re.escape(t) for t in literals] + list(FAMILY_PATTERNS)
        self.pattern = re.compile("|".join(alternatives))
        self.tokens = literals

    def escape(self, text: str) -> str:
        for _ in range(MAX_PASSES):
            escaped = self.pattern.sub(_break, text)
            if escaped == text:
                return text
            text = escaped
        # Each pass breaks every match it finds; anything left after that many passes is cut out.
        return self.pattern.sub("", text)

    def clean(self, text: str) -> bool:
        """Whether no token is left in `text` (what `escape` guarantees)."""
        return self.pattern.search(text) is None


def _break(match: re.Match) -> str:
    token = match.group(0)
    # A joiner after the first character and one before the last (one in the middle of a two-character token).
    if len(token) == 2:
        return token[0] + WORD_JOINER + token[1]
    return token[0] + WORD_JOINER + token[1:-1] + WORD_JOINER + token[-1]


DEFAULT_ESCAPER = TokenEscaper()
