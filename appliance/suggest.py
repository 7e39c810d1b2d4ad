"""The one did-you-mean helper: the closest known spelling of a mistyped name, for error messages."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate most like `word` (case-insensitive), or None when none is close."""
    lowered = {candidate.lower(): candidate for candidate in candidates}
    if word.lower() in lowered:
        return lowered[word.lower()]
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[close[0]] if close else None


def did_you_mean(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    """ "; did you mean 'x'?" or "" — ready to append to an error message."""
    match = closest(word, candidates, cutoff)
    return f"; did you mean '{match}'?" if match else ""
