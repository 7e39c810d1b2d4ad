"""Scores read from the judge's next-token probabilities (G-Eval style expected score).

The prompt ends with the opening of the answer (`{"score": `), so the next
token is the score. Over the scale's tokens (0..9, each one token) the
distribution p(v) gives the expected score sum(v * p(v)) / sum(p(v)),
normalised to 0..1. The probability mass on the scale's tokens, sum(p(v)), says
how sure the model is that a score comes next at all: below the job's
`judge.min_score_mass` the reading is a counted failure (the caller falls back
to the neutral score). Pure arithmetic on plain dicts: no engine, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Values below this probability are left out of the logged distribution.
LOGGED_MIN_PROBABILITY = 1e-3


@dataclass(frozen=True)
class ScoreReading:
    """One judged response read from a next-token distribution."""

    score: float | None  # expected score in 0..1; None when the mass was too low
    mass: float  # total probability on the scale's tokens
    distribution: dict[str, float]  # value -> probability renormalised over the scale, largest first
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.score is not None


def read_score(logprobs: dict[str, float], scale_max: int, min_mass: float) -> ScoreReading:
    """The expected score from the log-probabilities of the scale's values ("0".."9")."""
    # -inf (a value outside a remote engine's top logprobs) is probability 0, not an error.
    probabilities = {value: math.exp(lp) if math.isfinite(lp) else 0.0 for value, lp in logprobs.items()}
    mass = sum(probabilities.values())
    if not mass > 0:  # also catches NaN
        return ScoreReading(None, 0.0, {}, "no probability on any score token")
    normalised = {value: p / mass for value, p in probabilities.items()}
    distribution = {
        value: round(p, 4)
        for value, p in sorted(normalised.items(), key=lambda item: -item[1])
        if p >= LOGGED_MIN_PROBABILITY
    }
    if mass < min_mass:
        return ScoreReading(
            None,
            mass,
            distribution,
            f"probability mass on score tokens {mass:.3f} is below judge.min_score_mass {min_mass:g}",
        )
    expected = sum(int(value) * p for value, p in normalised.items()) / scale_max
    return ScoreReading(min(max(expected, 0.0), 1.0), mass, distribution)
