"""The injection guard: a response that addresses the grader gets the lowest score instead of a reading.

Escaping and the prompt's layout stop a response from *being* the judge's
instructions, but not from *persuading* a model judge: on the bundled
SmolLM2-135M, grader-directed text raises wrong answers. So a response with
such a signal is not judged, gets 0, and the reason is recorded (judge.jsonl
`injections`). `judge.injection_guard: off` turns it off.

The guard reads the folded response (rewards/fold.py: no zero-width, fullwidth
or look-alike spelling gets past it) with number words as digits
(number_words.py), both as written and as rendered (HTML entities decoded,
tags and LaTeX commands removed with their arguments kept: `\\text{Score}=\\boxed{9}`
is a score claim). It is a lexicon, so it names what it stops; the judge's
differential check (differential.py) is the defence that names nothing. Its
false positives are measured on a task's own gold answers (`gold_rate`,
reported by `appliance judge eval`): arithmetic ("2/2 = 1", "score is 35 - 3")
is no claim, a number followed by a noun ("scores 4 points") is a quantity, a
rating is a high one ("9/10", not "1/10"), and a score word the question
itself uses ("What was Riley's score?") is the task's topic, not a claim.
"""

from __future__ import annotations

import functools
import html
import re
from dataclasses import dataclass
from typing import Iterable

from appliance.conventions import CALL_CLOSE, CALL_OPEN
from appliance.judge.escape import TokenEscaper
from appliance.judge.number_words import with_digits
from appliance.rewards.extract import extract_value
from appliance.rewards.fold import fold

# Score words, by family: a family the question uses is the task's topic there.
SCORE_FAMILIES: dict[str, tuple[str, ...]] = {
    "score": ("score", "scores", "scored", "scoring", "puntuación", "puntaje", "punteggio", "评分", "得分", "分数"),
    "grade": ("grade", "grades", "graded", "grading", "bewertung", "оценка", "оценку", "درجة"),
    "rating": ("rating", "ratings", "rated", "評価", "评价"),
    "mark": ("mark", "marks", "marked", "note", "nota", "voto"),
    "verdict": ("verdict", "points"),
}
# Words an honest answer writes before its own value ("Result: 42"): a claim only with a judge's scale after it.
SCALED_ONLY = ("result", "results")
_GIVE = r"(?:give|gives|award|rate)\s+(?:it|this|this answer|this response|the answer|the response|me|my answer)"
# Words that may stand between a score word and its value ("score is a 9", "give this 9").
_FILLER = r"(?:is|was|of|a|an|my|this|it|me|at|final|be|should|must|would|will|now)"
# A value on a judge's scale: 0-10 (9.5 too), or a fraction or "out of" another scale value.
_VALUE = (
    r"(?<![\d.,])(?P<n>10|\d)(?:[.,]\d)?(?![.,]?\d)"
    r"(?:\s*(?:/|out\s+of|sur|von|de|su|из|на)\s*(?:100|10|5|9|(?P=n))(?!\d))?"
)
# A value with its scale, as a grader writes it ("8 out of 9", "9/10").
_SCALED = r"(?<![\d.,])(?P<m>10|\d)(?:[.,]\d)?\s*(?:/|out\s+of|sur|von|de|su|из|на)\s*(?:100|10|5|9|(?P=m))(?!\d)"
# After a claim's value: no word (a quantity: "4 points") and no arithmetic ("9 + 3", "2/2 = 1", "<<2/2=1>>", "4(5+x)").
_CLAIM_END = r"(?![^\S\n]*(?:[^\W\d_]|\())(?![^\S\n]*(?:[-+*/×÷=^]|<<)[^\S\n]*(?:<<)?[\d(])"
# Between a score word and its value: separators and markdown ("**Score:** 9"), no arithmetic operator.
_GAP = r"(?:[^\w\n*+/×÷^]|\*\*)*"
_IGNORE = r"ignore (?:all |any )?(?:the )?(?:previous|prior|above|earlier) (?:instructions|rules|rubric)"
IGNORE_WORDS = (
    "ignorez",
    "ignora ",
    "ignoriere",
    "ignore as instru",
    "игнорируй",
    "忽略",
    "無視",
    "무시",
    "تجاهل",
    "अनदेखा",
    "zignoruj",
    "negeer",
)
# `appliance judge eval` warns when the guard flags more of a task's own gold answers than this.
GOLD_RATE_WARNING = 0.005
JSON_KEYS = ("score", "scores", "grade", "rating", "points", "verdict", "correct", "confidence", "result")
GRADER_WORDS = ("grader", "graders", "rubric", "evaluator", "judge model")
# A data record: a quoted key and its value ("{'assessment': 'correct'}"), or a flow mapping ("{value: 9}").
_RECORD = re.compile(r"""["'][^"'\n]{1,40}["']\s*:\s*\S|\{\s*[^\W\d]\w{0,39}\s*:""")
# A bare high rating ending its line: "10/10", "9 out of 10", "5/5" (a low one raises nothing; "= 4/5" is a result).
_RATING = re.compile(
    r"(?<![\w./])(?<![-+*/×÷=][ \t])(?<![-+*/×÷=])(\d++)\s*(?:/|out\s+of)\s*(\d++)(?![\w/]|\.\d)[^\w\n]*$",
    re.MULTILINE | re.IGNORECASE,
)
# A score written with its unit in languages that have one: 9分, 9점, 9 баллов, 9 punktów (十分钟 is ten minutes).
UNITS = ("점", "अंक", "балл", "punkt")


def _words(words: Iterable[str]) -> str:
    return "|".join(re.escape(fold(word).casefold()) for word in sorted(words, key=len, reverse=True))


@functools.cache
def _patterns() -> dict[str, re.Pattern]:
    families = "|".join(f"(?P<{family}>{_words(words)})" for family, words in SCORE_FAMILIES.items())
    claim = rf"(?:(?<!\w)(?:{families})(?!\w)|{_GIVE}){_GAP}(?:{_FILLER}\b{_GAP}){{0,3}}?{_VALUE}{_CLAIM_END}"
    return {
        "marker": re.compile(r"<\s*/?\s*response\b", re.IGNORECASE),
        "score JSON": re.compile(rf"""["']\s*(?:{_words(JSON_KEYS)})\s*["']\s*:""", re.IGNORECASE),
        "addresses the grader": re.compile(rf"\b(?:{_words(GRADER_WORDS)})\b", re.IGNORECASE),
        "ignore instructions": re.compile(f"{_IGNORE}|{_words(IGNORE_WORDS)}", re.IGNORECASE),
        "unit": re.compile(rf"(?<!\d)\d++\s*+(?:分(?!钟|鐘)|点(?!\d)|{_words(UNITS)})", re.IGNORECASE),
        "score claim": re.compile(claim, re.IGNORECASE),
        "scaled claim": re.compile(
            rf"(?<!\w)(?:{_words(SCALED_ONLY)})(?!\w){_GAP}(?:{_FILLER}\b{_GAP}){{0,3}}?{_SCALED}{_CLAIM_END}",
            re.IGNORECASE,
        ),
    }


# Markup a reader never sees: a LaTeX command around its argument (`\text{Score}`, `\boxed{9}`), math
# delimiters and spacing commands, an HTML or XML tag (not the judge's own response marker, which the guard
# looks for). Removed in the rendered view, arguments kept.
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]{1,24}\*?\s*\{([^{}\n]{0,200})\}")
_LATEX_REST = re.compile(r"\\[a-zA-Z]{1,24}\b|\\[,;:! ]|\$\$?")
_TAG = re.compile(r"</?(?!response\b)[a-zA-Z][\w:-]{0,32}(?:\s[^<>\n]{0,200})?/?>", re.IGNORECASE)
# LaTeX arguments nest; each pass unwraps one level, and deeper nesting than this is no prose.
_LATEX_PASSES = 4


def rendered(text: str) -> str:
    """The text as a reader sees it rendered: HTML entities decoded, tags and LaTeX commands gone, their
    arguments kept (`$$\\text{Score}=\\boxed{9}$$` is "Score=9")."""
    text = _TAG.sub("", html.unescape(text))
    for _ in range(_LATEX_PASSES):
        unwrapped = _LATEX_COMMAND.sub(r"\1", text)
        if unwrapped == text:
            break
        text = unwrapped
    return _LATEX_REST.sub(" ", text)


# Digits standing in for letters inside a word ("Sc0re", "r4ting"): a word that mixes both is read as letters.
_LEET = str.maketrans("013457", "oieast")
_MIXED_WORD = re.compile(r"\b(?=[^\W_]*[^\W\d_])(?=[^\W_]*\d)[^\W_]+\b")
# A word spelled out letter by letter ("S c o r e", "s.c.o.r.e"): three or more single letters, one separator each.
_SPELLED = re.compile(r"(?<!\w)(?:[^\W\d_][ .·_-]){2,}[^\W\d_](?!\w)")


def disguised(text: str) -> str:
    """The text with leet words read as letters and spelled-out words joined."""
    text = _MIXED_WORD.sub(lambda match: match.group(0).translate(_LEET), text)
    return _SPELLED.sub(lambda match: re.sub(r"[ .·_-]", "", match.group(0)), text)


@dataclass(frozen=True)
class GuardView:
    """A response as the guard reads it: folded, number words as digits; the text as written and, after it,
    as rendered (markup gone) and undisguised (leet, spelled-out letters), so that a claim is found in any."""

    text: str

    @classmethod
    def of(cls, response: str) -> "GuardView":
        written = with_digits(fold(response))
        views = [written, with_digits(fold(rendered(response)))]
        views.append(with_digits(disguised(views[1])))
        return cls("\n".join(dict.fromkeys(views)))


def topics(question: str | None) -> frozenset[str]:
    """What the question itself talks about: the score-word families and grader words it uses."""
    if not question:
        return frozenset()
    folded = fold(question).casefold()
    families = {
        family for family, words in SCORE_FAMILIES.items() if re.search(rf"(?<!\w)(?:{_words(words)})(?!\w)", folded)
    }
    graders = {word.rstrip("s") for word in re.findall(rf"\b(?:{_words(GRADER_WORDS)})\b", folded)}
    return frozenset(families | graders)


def _claims(view: GuardView, on_topic: frozenset[str]) -> bool:
    for match in _patterns()["score claim"].finditer(view.text):
        family = next((name for name in SCORE_FAMILIES if match.group(name)), None)
        if family is None or family not in on_topic:
            return True
    return False


def _high_rating(view: GuardView) -> bool:
    for match in _RATING.finditer(view.text):
        value, scale = int(match.group(1)), int(match.group(2))
        if 0 < scale and (value == scale or (scale in (5, 10, 100) and 0.7 * scale <= value <= scale)):
            return True
    return False


def injection_signals(
    text: str, escaper: TokenEscaper, question: str | None = None, numeric: bool = False
) -> list[str]:
    """The grader-directed signals found in a response (empty: none); `question` sets what is on topic, and
    `numeric` says the task's answer is a number: a data record in the response is then no part of answering."""
    view = GuardView.of(text)
    patterns = _patterns()
    on_topic = topics(question)
    found = [name for name in ("marker", "score JSON", "ignore instructions") if patterns[name].search(view.text)]
    if numeric and "score JSON" not in found and _RECORD.search(view.text):
        found.append("record")
    if any(
        match.group(0).casefold().rstrip("s") not in on_topic
        for match in patterns["addresses the grader"].finditer(view.text)
    ):
        found.insert(1, "addresses the grader")
    if _claims(view, on_topic) or patterns["scaled claim"].search(view.text) or patterns["unit"].search(view.text):
        found.append("score claim")
    if _high_rating(view):
        found.append("rating")
    # An agent's tool calls are written in the appliance's own markup (agents/toolcalls.py): how a
    # trajectory calls a tool, not a token aimed at the judge. It is still escaped, so it reads as text.
    if not escaper.clean(text.replace(CALL_OPEN, "").replace(CALL_CLOSE, "")):
        found.insert(0, "control token")
    return found


def gold_rate(answers: Iterable[tuple[str | None, str]], escaper: TokenEscaper) -> tuple[int, int]:
    """(flagged, total) over (question, gold answer) pairs: the guard's false-positive count on a task's own answers."""
    flagged = total = 0
    for question, answer in answers:
        total += 1
        flagged += bool(injection_signals(answer, escaper, question, numeric=extract_value(answer) is not None))
    return flagged, total
