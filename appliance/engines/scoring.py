"""Helpers for `next_token_logprobs`: candidates as single token ids, shared token prefixes.

Both engines map the candidate strings (for the judge, the score digits) to
token ids the same way: in the context of the prompt, `prompt + candidate`
must tokenize to the prompt's tokens plus exactly one more token. A candidate
that merges with the prompt's last token or splits into two cannot be read
from one next-token distribution, and is an error naming it.
"""

from __future__ import annotations

from typing import Callable, Sequence

from appliance.errors import ApplianceError


class NotSingleTokenError(ApplianceError):
    """A candidate is not one token after the prompt; the message names it."""


def single_token_ids(encode: Callable[[str], list[int]], context: str, candidates: Sequence[str]) -> list[int]:
    """The token id of each candidate as the next token after `context` (NotSingleTokenError if not one token)."""
    base = encode(context)
    ids = []
    for candidate in candidates:
        full = encode(context + candidate)
        # One more token, and the prompt's own tokens unchanged: a candidate that merged with the prompt's last
        # token changes the prefix, and its id would be read at the wrong position.
        if len(full) != len(base) + 1 or full[: len(base)] != base:
            raise NotSingleTokenError(
                f"{candidate!r} is not a single token after {context[-20:]!r} for this tokenizer "
                f"({len(full) - len(base)} tokens); use a scale whose every value is one token"
            )
        ids.append(full[-1])
    if len(set(ids)) != len(ids):
        raise NotSingleTokenError(f"the candidates {list(candidates)!r} do not map to distinct tokens")
    return ids


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all sequences share, leaving each at least one token of its own."""
    if not sequences:
        return 0
    shortest = min(len(sequence) for sequence in sequences)
    length = 0
    first = sequences[0]
    # Each sequence keeps its last token out of the prefix: that token's logits are what is read after it.
    while length < shortest - 1 and all(sequence[length] == first[length] for sequence in sequences):
        length += 1
    return length
