"""The fold every check of a response reads: known spellings, the shipped table, and properties over any text."""

from __future__ import annotations

import hashlib
import re
import string
import unicodedata
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.rewards.fold import fold, fold_with_offsets, normalised, prototypes, skeleton

FOLDS = [
    # (spelling a reader sees as the right side, what the fold reads)
    ("\uff33\uff43\uff4f\uff52\uff45\uff1a\uff19", "Score:9"),  # fullwidth
    ("\U0001d412\U0001d41c\U0001d428\U0001d42b\U0001d41e: \U0001d7d7", "Score: 9"),  # mathematical bold
    ("sco\u200bre", "score"),  # zero-width space
    ("sc\u200core", "score"),  # zero-width non-joiner
    ("Gr\u00adade", "Grade"),  # soft hyphen
    ("\u202escore", "score"),  # a bidi override
    ("\u041cy \u0455\u0441\u043er\u0435", "My score"),  # Cyrillic letters that look Latin
    ("\u03a1oints", "Points"),  # a Greek capital rho
    ("caf\u00e9 na\u00efve", "cafe naive"),  # accents
    ("cafe\u0301", "cafe"),  # an accent as a combining mark
    ("\u0664\u0665 \u09ea\u09eb", "45 45"),  # Arabic-Indic and Bengali digits
    ("\u2468 x\u00b2 \u00bd", "9 x2 1/2"),  # circled, superscript, vulgar fraction
    ("4\u00b2 10\u00b3 3\u00bd \u2460\u2461", "4^2 10^3 3 1/2 1 2"),  # a styled digit never joins the one before
    ("\u00b9\u2070 \u2079\u2044\u2081\u2080", "10 9/10"),  # a run of one style is one number
    ("\u2792 \u277e \u24fd \u2793", "9 9 9 10"),  # dingbat and double-circled digits NFKC leaves alone
    ("\ua731\u1d04\u1d0f\u0280\u1d07", "score"),  # small capitals
    ("\U0001f182\U0001f172\U0001f17e\U0001f181\U0001f174", "SCORE"),  # negative squared letters
    ("\U0001f1f8core", "Score"),  # a regional indicator letter
    ("\uabaa\uab7c", "se"),  # lowercase Cherokee look-alikes, by their capitals
    ("\u0405\u0421\u041eR\u0415 \u0399S", "SCORE IS"),  # a capital look-alike folds to a capital (iota: I, not l)
    ("".join(chr(0xE0000 + ord(c)) for c in "Score: 9"), "Score: 9"),  # tag characters read as the ASCII they shadow
    ("43 \u2260 42", "43 \u2260 42"),  # "not equal" keeps its meaning
    ("43 =\u0338 42", "43 \u2260 42"),  # ... also when spelled with a combining slash
    ("\ubb34\uc2dc", "\ubb34\uc2dc"),  # Hangul stays whole
    ("\u8bc4\u5206", "\u8bc4\u5206"),  # Chinese is kept
]


@pytest.mark.parametrize("text, folded", FOLDS)
def test_known_spellings_fold_to_what_a_reader_sees(text, folded):
    assert fold(text) == folded


def test_the_skeleton_is_unicodes():
    # UTS #39's own example: Latin "paypal" and a spelling with Cyrillic "а" have one skeleton.
    assert skeleton("p\u0430yp\u0430l") == skeleton("paypal")
    assert skeleton("1") == skeleton("l") != skeleton("2")


def test_the_shipped_table_is_unicodes_17_0_0_as_published():
    data = resources.files("appliance.rewards") / "data"
    table = (data / "confusables.txt").read_bytes()
    readme = (data / "README.md").read_text()
    assert hashlib.sha256(table).hexdigest() in readme
    assert b"# Version: 17.0.0" in table and "Unicode License v3" in readme
    assert (data / "LICENSE").read_text().startswith("UNICODE LICENSE V3")
    assert len(prototypes()) > 6000 and prototypes()["\u0441"] == "c"


def test_responses_that_differ_only_in_spacing_are_one_text():
    assert normalised("9 * 5 = 45, so <answer>45</answer> ") == normalised("9*5=45, so <answer>45</answer>")
    assert normalised("the  answer\n is 4") == normalised("the answer is 4")
    assert normalised("the answer is 4") != normalised("theanswer is 4")  # words stay apart


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_is_its_own_fold(text):
    assert fold(text) == text


INVISIBLE = st.sampled_from(["\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u202e", "\u2066"])


@given(
    st.lists(st.text(alphabet=st.characters(max_codepoint=127), max_size=6), max_size=8),
    st.lists(INVISIBLE, min_size=8, max_size=8),
)
def test_no_invisible_character_changes_what_a_check_reads(parts, invisible):
    plain = "".join(parts)
    hidden = "".join(part + mark for part, mark in zip(parts, invisible))
    assert fold(hidden) == plain


# Characters that write one digit in a style of their own (superscript, circled, dingbat, fraction, ...).
STYLED_DIGITS = [
    c
    for c in map(chr, range(0x80, 0x20000))
    if unicodedata.category(c) == "No" and unicodedata.digit(c, None) is not None and unicodedata.digit(c) > 0
]


@settings(max_examples=200)
@given(st.integers(1, 10**6), st.sampled_from(STYLED_DIGITS))
def test_a_styled_digit_never_joins_the_number_before_it(number, styled):
    """ "4²" is not 42 and "3½" not 31: what rules read is the number a reader sees, whatever the style."""
    assert re.findall(r"\d+", fold(f"{number}{styled}"))[0] == str(number)


def _styled_letters() -> list[tuple[str, str]]:
    """(styled character, the ASCII letter it is) for every style of every Latin letter Unicode names."""
    styles = [
        "LATIN LETTER SMALL CAPITAL {}",
        "CIRCLED LATIN SMALL LETTER {}",
        "CIRCLED LATIN CAPITAL LETTER {}",
        "SQUARED LATIN CAPITAL LETTER {}",
        "NEGATIVE SQUARED LATIN CAPITAL LETTER {}",
        "NEGATIVE CIRCLED LATIN CAPITAL LETTER {}",
        "PARENTHESIZED LATIN SMALL LETTER {}",
        "REGIONAL INDICATOR SYMBOL LETTER {}",
        "MATHEMATICAL BOLD SMALL {}",
        "MATHEMATICAL SANS-SERIF BOLD ITALIC CAPITAL {}",
        "FULLWIDTH LATIN SMALL LETTER {}",
        "TAG LATIN SMALL LETTER {}",
    ]
    found = []
    for style in styles:
        for letter in string.ascii_uppercase:
            try:
                found.append((unicodedata.lookup(style.format(letter)), letter))
            except KeyError:
                continue
    return found


@pytest.mark.parametrize("styled, letter", _styled_letters())
def test_every_styled_latin_letter_folds_to_its_letter(styled, letter):
    assert fold(styled).casefold().strip("()") == letter.casefold()


@settings(max_examples=300)
@given(st.text())
def test_the_fold_is_stable_and_maps_back_onto_the_original(text):
    folded = fold_with_offsets(text)
    assert folded.text == fold(text)
    assert fold(folded.text) == folded.text  # folding twice changes nothing
    assert len(folded.starts) == len(folded.ends) == len(folded.text)
    for start, end in zip(folded.starts, folded.ends):
        assert 0 <= start < end <= len(text)
    assert list(folded.starts) == sorted(folded.starts)
    for match in re.finditer(r"\d+", folded.text):  # a span found in the fold is a span of the original
        begin, stop = folded.original(match.start(), match.end())
        assert match.group(0) in fold(text[begin:stop])  # one character may fold to several ("¼" is "1/4")
