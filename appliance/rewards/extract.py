"""Find the final numeric answer in a model's completion, and where it stands, and compare it with a reference.

Every reading is of the folded text (fold.py), so a fullwidth or Arabic-Indic
digit reads as the digit it shows. The result is a canonical string
("1,234.50" -> "1234.5"), so equal values compare equal as text too.
`answers_match` compares values exactly (fractions, no float rounding). A run
of more than MAX_DIGITS digits is no number (a degenerate sample, not an
answer), and a number the text negates ("not 42", "cannot be 42", "!= 42",
"≠ 42", "instead of 42", "not **42**", "<answer>42</answer> is wrong") or strikes out (`~~42~~`, `<del>42</del>`, or a combining stroke,
which the fold drops) is not its answer. `answer_core` says where the answer
and its working stand in the original text: what the judge's differential
check keeps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from appliance.rewards.fold import fold, fold_with_offsets

# Longer digit runs are no number: no answer needs them, and Python refuses to read past 4300 digits.
MAX_DIGITS = 64
# A number as people write it: optional sign (ASCII or Unicode minus), thousands commas or plain digits,
# optional decimals, an optional exponent ("42e-1" is 4.2, not 42), optional "/denominator", and no decimals cut
# short after it. The look-behind keeps
# "H2O" or "v1.2" tails from reading as numbers, and a thousands group is never a number of its own.
NUMBER = re.compile(
    r"(?<![\w.])(?!(?<=\d,)\d{3}(?!\d))(?P<sign>[-\u2212])?"
    rf"(?P<int>\d{{1,3}}(?:,\d{{3}}){{1,{MAX_DIGITS // 3}}}(?!,?\d)|\d{{1,{MAX_DIGITS}}}(?!\d|,\d{{3}})|(?=\.\d))"
    rf"(?P<frac>\.\d{{1,{MAX_DIGITS}}}(?!\d))?(?:[eE](?P<exp>[-+]?\d{{1,3}})(?!\d))?"
    rf"(?:\s*/\s*(?P<den>\d{{1,{MAX_DIGITS}}})(?!\d))?(?(frac)|(?!\.\d))"
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]{1,80})\s*\}\s*\{\s*(-?[\d.,]{1,80})\s*\}")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
_GSM8K_MARK = re.compile(r"####\s*(.*)")
# One line after the phrase, so later working ("check: 5 = 5") cannot take over.
_ANSWER_PROSE = re.compile(r"answer\s*(?:is|was|:|=)\s*:?\s*(.{0,80})", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# What right before a number says it is not the answer: "not", "cannot", "isn't" (or "isnt"), "(not)", "!=", "≠",
# "¬", "\\neq", "instead of", "rather than", "other than", "except", a few other languages' "not"; then any markup that
# opens the number on the same line ("not **42**", "not (42)", "not <answer>42", "not \\boxed{42}"), which a reader
# skips; a line that ends in "not" ("more than not") says nothing of a "#### 22" below it.
_NEGATION = re.compile(
    r"(?:!=|=/=|<>|≠|¬|\\neq?|\bnot|cannot|n't|\b(?:is|was|are|were|ca|do|does|did|wo|would|could|should|has|have|had)nt"
    r"|\bnever|\binstead\s+of|\brather\s+than|\bother\s+than|\banything\s+but|\bexcept(?:\s+for)?"
    r"|\bnicht|\bkeine?|\bpas|\bno\s+es|\bnao\s+e|\bnon\s+e)"
    r"(?:\s*[)\]])?(?:\s+(?:equal|equals|equal\s+to|be|been))?"
    r"(?:[ \t:=$€£(\[*_`\"'«]|<\w{1,32}>|\\(?:boxed|fbox)\s*\{|#{1,4})*\s*$",
    re.IGNORECASE,
)
# What right after a number says it is not the answer, past the markup closing it: "42 (wrong)", "42 (not)",
# "<answer>42</answer> is wrong", "42 is not the answer".
_DENIED_AFTER = re.compile(
    r"(?:[ \t*_`\"'»)\]}]|</\w{1,32}>)*"
    r"(?:\(\s*(?:not|wrong|incorrect)\s*\)|(?:is|was|would\s+be|seems)\s+(?:wrong|incorrect|false"
    r"|not\s+(?:right|correct|it|the\s+answer))\b)",
    re.IGNORECASE,
)
# How far before a number its negation is read.
_NEGATION_WINDOW = 32
# Struck-out text, in markdown or HTML, on one line: a number a reader sees crossed out is not an answer.
_STRUCK = re.compile(r"~~(?!~)[^\n]{1,200}?~~|<(s|del|strike)>[^\n]{0,200}?</\1>", re.IGNORECASE)
# An equals sign that states equality ("x = 5"), not part of "!=", "<=", ">=", "==" or "=/=".
_EQUALS = re.compile(r"(?<![!<>=/])=(?![=/])")
# After an answer: the sentence punctuation and closing tags that close it on its line ("45.", "50</effect>",
# "4 + 1 =", a dangling "21 <"), never the start of another tag, nor a mark that only decorates ("✓", "|").
_CLOSING = re.compile(r"""(?:</\w{1,32}>|<(?![/\w])|[ \t.,;:!?=)\]"'*%$€£])*""")
WORKING_OPEN = "<reasoning>"


@dataclass(frozen=True)
class Found:
    """A number in a text: where it stands and its value."""

    start: int
    end: int
    value: Fraction


@dataclass(frozen=True)
class AnswerSpan:
    """Where the final answer stands in a (folded) text: the whole marked span, or the number itself; where
    its number ends, where closed markup's closing starts (`end` when it has none), and whether a marker
    (not the last-number rule) found it; where the markup's inside and the number start, and where an earlier
    answer in the same closed markup ends (None when this is the first)."""

    start: int
    end: int
    value: Fraction
    number_end: int
    close_start: int
    marked: bool
    inner_start: int
    number_start: int
    first_end: int | None = None


def _value(match: re.Match) -> Fraction | None:
    digits = match.group("int").replace(",", "") + (match.group("frac") or "")
    value = Fraction(digits) * Fraction(10) ** int(match.group("exp") or 0)
    denominator = match.group("den")
    if denominator is not None:
        if int(denominator) == 0:
            return None
        value /= int(denominator)
    return -value if match.group("sign") else value


def _latex_value(match: re.Match) -> Fraction | None:
    numerator, denominator = (parse_number(group) for group in match.groups())
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def numbers(text: str, start: int = 0, end: int | None = None) -> list[Found]:
    """Every number in text[start:end] that the text does not negate, in order (LaTeX fractions included)."""
    end = len(text) if end is None else end
    region = text[start:end]
    latex = [(m.start(), m.end(), _latex_value(m)) for m in _LATEX_FRAC.finditer(region)]
    plain = [
        (m.start(), m.end(), _value(m))
        for m in NUMBER.finditer(region)
        if not any(s <= m.start() < e for s, e, _ in latex)
    ]
    struck = [(m.start(), m.end()) for m in _STRUCK.finditer(region)]
    found = []
    for position, stop, value in sorted(latex + plain, key=lambda item: item[0]):
        if any(s <= position < e for s, e in struck):
            continue
        # Read in the whole text, not the region: "not <answer>42</answer>" denies the 42 inside the span.
        at, after = start + position, start + stop
        if value is None or _NEGATION.search(text[max(0, at - _NEGATION_WINDOW) : at]):
            continue
        if not _DENIED_AFTER.match(text, after):
            found.append(Found(at, after, value))
    return found


def parse_number(text: str) -> Fraction | None:
    """The value of the first number in `text` (see the module docstring), or None."""
    found = numbers(text)
    return found[0].value if found else None


def _number_in_span(text: str, start: int, end: int) -> Found | None:
    """The answer inside a marked span: the first number after the last '=', else the first number."""
    found = numbers(text, start, end)
    if not found:
        return None
    equals = [m.end() for m in _EQUALS.finditer(text, start, end)]
    after = [number for number in found if equals and number.start >= equals[-1]]
    return after[0] if after else found[0]


def _boxed_spans(text: str) -> list[tuple[int, int, int, int]]:
    """(start, end, inner start, inner end) of every closed \\boxed{...}, with nested braces balanced, in order
    of their starts. One pass with a stack of open braces: a text of many unclosed boxes costs its length."""
    boxes = {match.end() - 1: match.start() for match in _BOXED.finditer(text)}
    spans, opened = [], []
    for brace in re.finditer(r"[{}]", text):
        position = brace.start()
        if brace.group(0) == "{":
            opened.append(position)
        elif opened:
            start = opened.pop()
            if start in boxes:
                spans.append((boxes[start], position + 1, start + 1, position))
    return sorted(spans)


def _marked_spans(text: str) -> list[tuple[list[tuple[int, int, int, int]], bool]]:
    """Candidate spans per rule, in priority order, the last span first; and whether the markup closes
    (a closed span ends at its closing markup, an open one at the answer's number)."""
    # No answer tag closes after the last "</answer>": searching past it would rescan the rest for each opening.
    tags_end = max((match.end() for match in _ANSWER_CLOSE.finditer(text)), default=0)
    groups = lambda pattern, end: [  # noqa: E731
        (m.start(), m.end(), m.start(1), m.end(1)) for m in pattern.finditer(text, 0, end)
    ]
    return [
        (list(reversed(groups(_ANSWER_TAG, tags_end))), True),
        (list(reversed(_boxed_spans(text))), True),
        (list(reversed(groups(_GSM8K_MARK, len(text)))), False),
        (list(reversed(groups(_ANSWER_PROSE, len(text)))), False),
    ]


def locate_answer(folded: str) -> AnswerSpan | None:
    """Where the final answer of a folded text stands, with its value; None when the text holds no number.

    The answer is looked for where a model or a dataset marks it, in this order, taking the last marker of the
    first kind found: `<answer>...</answer>` (what the format rewards teach), `\\boxed{...}` (math-tuned models),
    `#### N` (GSM8K solutions, so references parse the same way), "the answer is N" / "answer: N", else the last
    number anywhere. Inside a marked span the number after the last "=" wins ("6 * 7 = 42"), else the first one
    ("18 dollars (3 bags)"); a span with no number falls through to the next rule.
    """
    for spans, closed in _marked_spans(folded):
        for index, (start, end, inner_start, inner_end) in enumerate(spans):
            found = _number_in_span(folded, inner_start, inner_end)
            if found is None:
                continue
            if not closed:
                return AnswerSpan(start, found.end, found.value, found.end, found.end, True, inner_start, found.start)
            earlier = [e for s, e, i, j in spans[index + 1 :] if e <= start and _number_in_span(folded, i, j)]
            first_end = min(earlier, default=None)
            return AnswerSpan(start, end, found.value, found.end, inner_end, True, inner_start, found.start, first_end)
    found = numbers(folded)
    if not found:
        return None
    last = found[-1]
    return AnswerSpan(last.start, last.end, last.value, last.end, last.end, False, last.start, last.start)


def format_number(value: Fraction) -> str:
    """Canonical, exact text of a value: "72", "-3.5", or "1/3" when no finite decimal exists."""
    if value.denominator == 1:
        return str(value.numerator)
    twos = fives = 0
    rest = value.denominator
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:  # a prime factor other than 2 and 5: no finite decimal
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator * 10**places // value.denominator)
    whole, decimals = divmod(scaled, 10**places)
    sign = "-" if value < 0 else ""
    return f"{sign}{whole}.{decimals:0{places}d}".rstrip("0")


def extract_value(text: str | None) -> Fraction | None:
    """The numeric value of the final answer in `text` (folded first; see `locate_answer`), or None.

    Numbers may carry a sign, thousands commas, decimals, a currency sign or unit, or be a fraction
    ("3/4", `\\frac{3}{4}`).
    """
    if not text:
        return None
    span = locate_answer(fold(text))
    return None if span is None else span.value


def extract_answer(text: str | None) -> str | None:
    """The final answer in `text` as a canonical number string ("1,234" -> "1234"), or None."""
    value = extract_value(text)
    return None if value is None else format_number(value)


def answers_match(predicted: str | None, reference: str | None) -> bool:
    """True when both hold a number and the numbers are equal ("3.50" == "3.5", "#### 72" == "72")."""
    predicted_value = extract_value(predicted)
    reference_value = extract_value(reference)
    return predicted_value is not None and predicted_value == reference_value


def answer_core(text: str) -> str | None:
    """The answer and the working before it, as the rules read them; None when the text holds no number.

    The working starts at the task's `<reasoning>` block when one opens before the answer, else at the text's
    start. A marked answer ends at its number and the punctuation closing it on its line; in closed markup
    (`<answer>42 ...</answer>`) nothing between the number and the closing is kept. An unmarked answer (its
    value is the last number) has no declared end, so it ends with its working: at its last computation
    ("6 * 11 = 66") or that result restated on its line ("= 66, so 66"), else with its first line, cut after
    the answer when the answer stands on it.
    What lies outside is not part of answering: the judge's differential check (judge/differential.py)
    scores the text without it.
    """
    folded = fold_with_offsets(text)
    span = locate_answer(folded.text)
    if span is None:
        return None
    start = max(folded.text.find(WORKING_OPEN, 0, span.start), 0)
    if not span.marked:
        pieces = [(start, _unmarked_end(folded.text, span))]
    else:
        # The working, the marker, and inside it the expression that gives the number.
        working_end = span.start if span.first_end is None else span.first_end
        pieces = [(start, working_end), (span.start, span.inner_start)]
        expression = _expression_start(folded.text, span)
        if span.close_start < span.end:
            between = folded.text[span.number_end : span.close_start]
            pieces.append((expression, span.close_start if not between.strip() else span.number_end))
            pieces.append((span.close_start, _closed(folded.text, span.end)))
        else:
            pieces.append((expression, _closed(folded.text, span.end)))
    # The answer's line: where the working piece ends (a marked answer's, or the first of two), else the number's.
    on_answer_line = pieces[0][1] if span.marked else span.start
    pieces[:1] = _working_lines(folded.text, *pieces[0], folded.text.rfind("\n", 0, on_answer_line) + 1)
    return "".join(text[slice(*folded.original(a, b))] for a, b in pieces if a < b)


# A line of working: it holds a number, or it is blank or markup alone ("<reasoning>", "</reasoning>").
_WORKING_LINE = re.compile(r"[^\n]*\d[^\n]*|[ \t]*(?:</?\w{1,32}>[ \t]*)*", re.ASCII)


def _working_lines(folded: str, start: int, end: int, answer_line: int) -> list[tuple[int, int]]:
    """The working before the answer's line, without its lines that hold no number ("Checked against the
    key: this is right."): talk, not working. Nothing is cut when the core ends before the answer's line."""
    if end < answer_line:
        return [(start, end)]
    kept, position = [], start
    while position < answer_line:
        line_end = folded.find("\n", position, answer_line)
        line_end = answer_line - 1 if line_end < 0 else line_end
        if _WORKING_LINE.fullmatch(folded, position, line_end):
            kept.append((position, line_end + 1))
        position = line_end + 1
    return [*kept, (answer_line, end)]


# What may stand inside answer markup before its number and still be the answer: arithmetic ("6 * 7 = 42",
# "$42", "(3 + 4) x 6"), not words ("verified: 42").
_EXPRESSION = re.compile(r"[\d\s+\-\u2212*/×÷=^().,$€£%x]*$", re.IGNORECASE)
_EXPRESSION_OPEN = re.compile(r"[\d(\-\u2212$€£.]")


def _expression_start(folded: str, span: AnswerSpan) -> int:
    """Where the answer's expression starts inside its markup: the markup's inside when all of it before the
    number is arithmetic or blank, else the arithmetic right before the number (words before it are cut)."""
    before = folded[span.inner_start : span.number_start]
    run = _EXPRESSION.search(before)
    if not before[: run.start()].strip():
        return span.inner_start
    opening = _EXPRESSION_OPEN.search(before, run.start())
    return span.inner_start + (opening.start() if opening else len(before))


# Arithmetic between two numbers ("6 * 11", "12 x 2", "4 + 1", "= 66"): the working of an unmarked answer.
_COMPUTES = re.compile(r"(?<=[\d)])[ \t]*(?:[-+*/×÷^=]|x(?=\s))[ \t]*(?=[\d(])", re.IGNORECASE)


def _closed(folded: str, end: int) -> int:
    """`end` moved past the punctuation and closing tags that close the answer on its line."""
    return end + len(_CLOSING.match(folded, end).group(0).rstrip())


def _unmarked_end(folded: str, span: AnswerSpan) -> int:
    """Where an unmarked answer's working ends (see `answer_core`)."""
    computing = list(_COMPUTES.finditer(folded, 0, span.end))
    if computing:  # the number the last computation ends with, its restatements on that line, what closes them
        line_end = folded.find("\n", computing[-1].end())
        found = numbers(folded, computing[-1].end(), len(folded) if line_end < 0 else line_end)
        if not found:
            return _closed(folded, computing[-1].end())
        return _closed(folded, [n for n in found if n.value == found[0].value][-1].end)
    # With nothing computed, a line after the first only comments on the answer.
    line_start = len(folded) - len(folded.lstrip())
    line_end = folded.find("\n", line_start)
    line_end = len(folded) if line_end < 0 else line_end
    if line_start <= span.start < line_end:
        return _closed(folded, span.end)
    return line_start + len(folded[line_start:line_end].rstrip())
