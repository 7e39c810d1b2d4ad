"""The injection guard: a response that addresses the grader gets the lowest score instead of a reading.

Escaping and the prompt's layout stop a response from *being* the judge's
instructions, but not from *persuading* a model judge: on the bundled
SmolLM2-135M, grader-directed text raised the scores of wrong answers
(tests/judge/test_adversarial.py). So a response with such a signal is not
judged, gets 0, and the reason is recorded (judge.jsonl `injections`).
`judge.injection_guard: off` turns it off for tasks that talk about scores.
"""

from __future__ import annotations

import re

from appliance.conventions import CALL_CLOSE, CALL_OPEN
from appliance.judge.escape import TokenEscaper

_SCORE_WORDS = (
    r"\b(?:score|scores|scoring|grade|graded|grading|rating|note|nota|puntuaci[oó]n|puntaje|punteggio|voto"
    r"|bewertung|rate (?:this|it|the answer|the response)|give (?:it|this|this response|this answer|the response))\b"
    r"|درجة|оценк"
)
_IGNORE = (
    r"ignore (?:all |any )?(?:the )?(?:previous|prior|above|earlier) (?:instructions|rules|rubric)"
    r"|ignorez|ignora |ignoriere|ignore as instru|игнорируй|忽略|無視|무시|تجاهل|अनदेखा|zignoruj|negeer"
)
# None of these does a genuine answer need. A lexicon: it can miss a new phrasing and can flag an answer that talks
# about scores (a word problem about a game's score); the adversarial test measures the judge both ways.
SIGNALS = (
    ("marker", re.compile(r"</?\s*response\b", re.IGNORECASE)),
    ("score JSON", re.compile(r"""["']\s*(?:score|scores|grade|rating)\s*["']\s*:""", re.IGNORECASE)),
    ("addresses the grader", re.compile(r"\b(?:grader|graders|rubric|evaluator|judge model)\b", re.IGNORECASE)),
    ("ignore instructions", re.compile(_IGNORE, re.IGNORECASE)),
    (
        "score claim",
        re.compile(
            rf"(?:{_SCORE_WORDS})\W{{0,3}}(?:\w+\W{{1,3}}){{0,3}}?\d+\b"  # score of 9, note 9, give it 9
            r"|\b(\d|10)\s*/\s*\1\b|\b\d+\s+out of\s+\d+\b"  # 9/9, 9 out of 9
            r"|\d+\s*(?:分|점|点|अंक|балл|punkt)",  # 9分, 9점, 9 баллов, 9 punktów
            re.IGNORECASE,
        ),
    ),
)


def injection_signals(text: str, escaper: TokenEscaper) -> list[str]:
    """The grader-directed signals found in a response (empty: none)."""
    found = [name for name, pattern in SIGNALS if pattern.search(text)]
    # An agent's tool calls are written in the appliance's own markup (agents/toolcalls.py): how a
    # trajectory calls a tool, not a token aimed at the judge. It is still escaped, so it reads as text.
    if not escaper.clean(text.replace(CALL_OPEN, "").replace(CALL_CLOSE, "")):
        found.insert(0, "control token")
    return found
