"""Check that a job's rubric names no score outside the scale the judge reads.

Probability scoring reads one digit, 0-9; generate scoring asks for 0-10. A
rubric that says "give 10 for a perfect answer" under probability scoring is
read as "1" on tokenizers that split digits and loses its mass on the others,
so it is a configuration error, found when the job is checked and again when
the judge loads. Only numbers in a score context count ("score 10", "10/10",
"7 out of 10", "0-10", "a 10-point scale", "10 points"), so "answers over 100
words" is not taken for a score.
"""

from __future__ import annotations

import re

from appliance.errors import ApplianceError

PROBABILITY_MAX = 9
GENERATE_MAX = 10

_SCORE_WORD = r"(?:scores?|scored|scoring|grades?|graded|rate|rated|rating|give|gives|gets?|award|awarded|marks?)"
# The contexts that make a number a score: "7/10", "score 10" (or "give it 0-10", within a few words of the verb),
# "a scale of 1 to 10", "10 points". The character classes stop at a sentence end so two sentences never pair.
_PATTERNS = (
    re.compile(r"\b(\d+)\s*(?:/|out of)\s*(\d+)\b", re.IGNORECASE),
    re.compile(rf"\b{_SCORE_WORD}\b[^.\n\d]{{0,24}}?\b(\d+)\b(?:\s*(?:-|–|to)\s*(\d+)\b)?", re.IGNORECASE),
    re.compile(r"\bscale\b[^.\n\d]{0,16}?\b(\d+)\b(?:\s*(?:-|–|to)\s*(\d+)\b)?", re.IGNORECASE),
    re.compile(r"\b(\d+)\s*[- ]?(?:points?|stars?)\b", re.IGNORECASE),
)


class RubricScaleError(ApplianceError):
    """The rubric names a score the judge's scale cannot express; the message names it and the fix."""


def scale_max(scoring: str) -> int:
    """The highest score the judge reads under `scoring` (auto reads probabilities on every built-in engine)."""
    return GENERATE_MAX if scoring == "generate" else PROBABILITY_MAX


def scores_named(rubric: str) -> list[tuple[int, str]]:
    """(score, the words around it) for every number the rubric uses as a score."""
    found = []
    for pattern in _PATTERNS:
        for match in pattern.finditer(rubric):
            for group in match.groups():
                if group is not None:
                    found.append((int(group), match.group(0).strip()))
    return found


def check_rubric_scale(rubric: str | None, scoring: str) -> None:
    """RubricScaleError if the rubric names a score above the scale of `scoring`."""
    if not rubric:
        return
    top = scale_max(scoring)
    outside = [(value, words) for value, words in scores_named(rubric) if value > top]
    if not outside:
        return
    value, words = max(outside)
    fix = f"write the rubric's scores on 0-{top}"
    if scoring != "generate" and value <= GENERATE_MAX:
        fix += f" or set judge.scoring: generate (0-{GENERATE_MAX})"
    raise RubricScaleError(
        f"judge.rubric names the score {value} ({words[:60]!r}), but judge.scoring {scoring} reads "
        f"scores 0-{top}: {fix}"
    )
