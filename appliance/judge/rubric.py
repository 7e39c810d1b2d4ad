"""Check that a job's rubric names no score outside the scale the judge reads.

Probability scoring reads one digit, 0-9: a rubric that says "give 10 for a
perfect answer" is read as "1" on tokenizers that split digits and loses its
mass on the others. Whether a number in a rubric is a score cannot be told
from its phrasing ("Scores: 0 (wrong) ... 10 (perfect)", "a ten-point scale",
"out of ten"), so a probability-scored rubric may name no number above 9 at
all, in digits or words, unless the job lists it in `judge.rubric_numbers`
("answers over 100 words": [100]). Generate scoring asks for 0-10, and only
numbers in a score context count there ("score 100", "0-100", "out of 100").
Found when the job is checked (job_checks.py) and again when the judge loads.
"""

from __future__ import annotations

import re
from typing import Iterable

from appliance.errors import ApplianceError
from appliance.judge.number_words import with_digits
from appliance.rewards.fold import fold

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
_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d+)?")


class RubricScaleError(ApplianceError):
    """The rubric names a score the judge's scale cannot express; the message names it and the fix."""


def scale_max(scoring: str) -> int:
    """The highest score the judge reads under `scoring` (auto reads probabilities on every built-in engine)."""
    return GENERATE_MAX if scoring == "generate" else PROBABILITY_MAX


def _readable(rubric: str) -> str:
    return with_digits(fold(rubric))


def scores_named(rubric: str) -> list[tuple[int, str]]:
    """(score, the words around it) for every number the rubric uses in a score context."""
    text = _readable(rubric)
    found = []
    for pattern in _PATTERNS:
        for match in pattern.finditer(text):
            for group in match.groups():
                if group is not None:
                    found.append((int(group), match.group(0).strip()))
    return found


def numbers_named(rubric: str) -> list[tuple[float, str]]:
    """(number, the words around it) for every number the rubric names, in digits or in words."""
    text = _readable(rubric)
    return [
        (float(match.group(0)), text[max(0, match.start() - 24) : match.end() + 24].strip())
        for match in _NUMBER.finditer(text)
    ]


def check_rubric_scale(rubric: str | None, scoring: str, allowed: Iterable[float] = ()) -> None:
    """RubricScaleError if the rubric names a number above the scale of `scoring` (`allowed`: judge.rubric_numbers)."""
    if not rubric:
        return
    top = scale_max(scoring)
    if scoring == "generate":
        outside = [(float(value), words) for value, words in scores_named(rubric) if value > top]
    else:
        allowed = set(allowed)
        outside = [(value, words) for value, words in numbers_named(rubric) if value > top and value not in allowed]
    if not outside:
        return
    value, words = max(outside)
    shown = f"{value:g}"
    if scoring == "generate":
        raise RubricScaleError(
            f"judge.rubric names the score {shown} ({words[:60]!r}), but judge.scoring generate reads "
            f"scores 0-{top}: write the rubric's scores on 0-{top}"
        )
    fix = f"write the rubric's scores on 0-{top}"
    if value <= GENERATE_MAX:
        fix += f", set judge.scoring: generate (0-{GENERATE_MAX})"
    raise RubricScaleError(
        f"judge.rubric names the number {shown} ({words[:60]!r}), but judge.scoring {scoring} reads scores 0-{top} "
        f"(one digit): {fix}, or, if {shown} is not a score, list it in judge.rubric_numbers"
    )
