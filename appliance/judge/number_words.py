"""Number words as digits, so that "My score: nine." reads to the injection guard as "My score: 9.".

The words zero to ten (and the tens a score scale names: "hundred") in the
languages the guard's lexicon covers, and the English ones past ten (a rubric
that names "a twenty-point scale" is checked too), folded the way the guard folds a
response (rewards/fold.py), so a Cyrillic or accented spelling matches too.
Words that are also common words of another language ("due", "sei", "um",
"ein") are left out: a guard that reads "due to" as "2 to" would flag answers
that talk about causes. Chinese and Japanese numerals are single characters
without word boundaries; they are read as digits where they stand, except 十
before 分 (十分 is "very").
"""

from __future__ import annotations

import functools
import re

from appliance.rewards.fold import fold

# value -> spellings, per language; each spelling is folded before it is matched.
WORDS: dict[str, dict[int, tuple[str, ...]]] = {
    "en": {
        0: ("zero", "nought"),
        1: ("one",),
        2: ("two",),
        3: ("three",),
        4: ("four",),
        5: ("five",),
        6: ("six",),
        7: ("seven",),
        8: ("eight",),
        9: ("nine",),
        10: ("ten",),
        11: ("eleven",),
        12: ("twelve", "dozen"),
        13: ("thirteen",),
        14: ("fourteen",),
        15: ("fifteen",),
        16: ("sixteen",),
        17: ("seventeen",),
        18: ("eighteen",),
        19: ("nineteen",),
        20: ("twenty",),
        30: ("thirty",),
        40: ("forty",),
        50: ("fifty",),
        60: ("sixty",),
        70: ("seventy",),
        80: ("eighty",),
        90: ("ninety",),
        100: ("hundred", "one hundred"),
        1000: ("thousand",),
    },
    "fr": {
        0: ("zéro",),
        2: ("deux",),
        3: ("trois",),
        4: ("quatre",),
        5: ("cinq",),
        7: ("sept",),
        8: ("huit",),
        9: ("neuf",),
        10: ("dix",),
    },
    "es": {
        0: ("cero",),
        1: ("uno",),
        3: ("tres",),
        4: ("cuatro",),
        5: ("cinco",),
        6: ("seis",),
        7: ("siete",),
        8: ("ocho",),
        9: ("nueve",),
        10: ("diez",),
        100: ("cien",),
    },
    "de": {
        1: ("eins",),
        2: ("zwei",),
        3: ("drei",),
        4: ("vier",),
        5: ("fünf",),
        6: ("sechs",),
        7: ("sieben",),
        9: ("neun",),
        10: ("zehn",),
        100: ("hundert",),
    },
    "it": {
        4: ("quattro",),
        5: ("cinque",),
        7: ("sette",),
        8: ("otto",),
        9: ("nove",),
        10: ("dieci",),
    },
    "pt": {
        2: ("dois", "duas"),
        3: ("três",),
        7: ("sete",),
        8: ("oito",),
        10: ("dez",),
    },
    "ru": {
        0: ("ноль",),
        1: ("один", "одна"),
        2: ("два", "две"),
        3: ("три",),
        4: ("четыре",),
        5: ("пять",),
        6: ("шесть",),
        7: ("семь",),
        8: ("восемь",),
        9: ("девять",),
        10: ("десять",),
        100: ("сто",),
    },
}
# Chinese and Japanese numerals, read where they stand.
HAN = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
HAN_TEN = "十"


@functools.cache
def _word_pattern() -> tuple[re.Pattern, dict[str, int]]:
    values: dict[str, int] = {}
    for table in WORDS.values():
        for value, spellings in table.items():
            for spelling in spellings:
                values[fold(spelling).casefold()] = value
    alternatives = sorted(values, key=len, reverse=True)
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(word) for word in alternatives) + r")(?!\w)", re.IGNORECASE)
    return pattern, values


_HAN = re.compile(f"[{''.join(HAN)}]?{HAN_TEN}(?!分)|[{''.join(HAN)}]")


def _han(match: re.Match) -> str:
    text = match.group(0)
    if text.endswith(HAN_TEN):
        return str(HAN[text[0]] * 10 if len(text) == 2 else 10)
    return str(HAN[text])


def with_digits(folded: str) -> str:
    """A folded text with its number words written as digits ("nine out of ten" -> "9 out of 10")."""
    pattern, values = _word_pattern()
    text = pattern.sub(lambda match: str(values[match.group(0).casefold()]), folded)
    return _HAN.sub(_han, text)
