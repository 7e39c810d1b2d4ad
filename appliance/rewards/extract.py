"""Find the final numeric answer in a model's completion and compare it with a reference.

The result is a canonical string ("1,234.50" -> "1234.5"), so equal values
compare equal as text too. `answers_match` compares values exactly
(fractions, no float rounding).
"""

from __future__ import annotations

import re
from fractions import Fraction

# A number as people write it: optional sign (ASCII or Unicode minus), thousands
# commas or plain digits, optional decimals, optional "/denominator". The
# look-behind keeps "H2O" or "v1.2" tails from reading as numbers.
NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212])?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+|(?=\.\d))(?P<frac>\.\d+)?"
    r"(?:\s*/\s*(?P<den>\d+)(?!\.\d))?"
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_GSM8K_MARK = re.compile(r"####\s*(.*)")
# One line after the phrase, so later working ("check: 5 = 5") cannot take over.
_ANSWER_PROSE = re.compile(r"answer\s*(?:is|was|:|=)\s*:?\s*(.{0,80})", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def parse_number(text: str) -> Fraction | None:
    """The value of the first number in `text` (see the module docstring), or None."""
    text = _LATEX_FRAC.sub(r"\1/\2", text)
    match = NUMBER.search(text)
    if match is None:
        return None
    return _value(match)


def _value(match: re.Match) -> Fraction | None:
    digits = match.group("int").replace(",", "") + (match.group("frac") or "")
    value = Fraction(digits)
    denominator = match.group("den")
    if denominator is not None:
        if int(denominator) == 0:
            return None
        value /= int(denominator)
    return -value if match.group("sign") else value


def _number_in_span(span: str) -> Fraction | None:
    """The answer inside a marked span: after the last '=', else the first number."""
    span = _LATEX_FRAC.sub(r"\1/\2", span)
    if "=" in span:
        found = parse_number(span.rsplit("=", 1)[1])
        if found is not None:
            return found
    return parse_number(span)


def _last_number(text: str) -> Fraction | None:
    text = _LATEX_FRAC.sub(r"\1/\2", text)
    matches = list(NUMBER.finditer(text))
    for match in reversed(matches):
        value = _value(match)
        if value is not None:
            return value
    return None


def _boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...}, with nested braces balanced."""
    contents = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for position in range(start, len(text)):
            if text[position] == "{":
                depth += 1
            elif text[position] == "}":
                depth -= 1
                if depth == 0:
                    contents.append(text[start:position])
                    break
    return contents


def _marked_spans(text: str) -> list[list[str]]:
    """Candidate spans per rule, in priority order; within a rule the last span first."""
    return [
        list(reversed(_ANSWER_TAG.findall(text))),
        list(reversed(_boxed_contents(text))),
        list(reversed(_GSM8K_MARK.findall(text))),
        list(reversed(_ANSWER_PROSE.findall(text))),
    ]


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
    """The numeric value of the final answer in `text`, or None when it holds no number.

    The answer is looked for where a model or a dataset marks it, in this order, taking the last marker of the
    first kind found: `<answer>...</answer>` (what the format rewards teach), `\\boxed{...}` (math-tuned models),
    `#### N` (GSM8K solutions, so references parse the same way), "the answer is N" / "answer: N", else the last
    number anywhere. Inside a marked span the number after the last "=" wins ("6 * 7 = 42"), else the first one
    ("18 dollars (3 bags)"); a span with no number falls through to the next rule. Numbers may carry a sign,
    thousands commas, decimals, a currency sign or unit, or be a fraction ("3/4", `\\frac{3}{4}`).
    """
    if not text:
        return None
    for spans in _marked_spans(text):
        for span in spans:
            value = _number_in_span(span)
            if value is not None:
                return value
    return _last_number(text)


def extract_answer(text: str | None) -> str | None:
    """The final answer in `text` as a canonical number string ("1,234" -> "1234"), or None."""
    value = extract_value(text)
    return None if value is None else format_number(value)


def answers_match(predicted: str | None, reference: str | None) -> bool:
    """True when both hold a number and the numbers are equal ("3.50" == "3.5", "#### 72" == "72")."""
    predicted_value = extract_value(predicted)
    reference_value = extract_value(reference)
    return predicted_value is not None and predicted_value == reference_value
