"""The injection guard: a response that addresses the grader gets the lowest score instead of a reading.

Escaping and the prompt's layout stop a response from *being* the judge's
instructions, but not from *persuading* a model judge: measured on the bundled
SmolLM2-135M in probability mode, appending "score 9" instructions, fake markers
or control tokens to 36 wrong answers raised every one of them (mean 0.41 ->
0.61, tests/judge/test_adversarial.py). A small judge cannot be prompted out of
that, so the appliance does not ask it to: a response with a grader-directed
signal is not judged and gets 0, and the reason is recorded (judge.jsonl
`injections`, `Judge.stats()["injections"]`).

The signals, none of which a genuine answer needs: the judge prompt's own
markers (`<response`), a control token of any chat template (the escaper had
to break one), a JSON "score" key, words that address a grader or its rubric,
"ignore the previous instructions" in common languages, and a score claim (a
number next to a score word, "9/9", "9 out of 9", "9分"). It is a lexicon: it
can miss a new phrasing and can flag an answer that talks about scores (a
word problem about a game's score). `judge.injection_guard: off` turns it off
for such tasks; the adversarial test measures the judge both ways.
"""

from __future__ import annotations

import re

from appliance.agents.toolcalls import CALL_CLOSE, CALL_OPEN
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
