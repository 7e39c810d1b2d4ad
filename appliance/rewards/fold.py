"""The folded form of a text: what every check of a response reads (the judge's guard, group dedup, rule rewards).

A student can spell what a check looks for in ways a reader does not notice:
fullwidth or mathematical letters, a zero-width space inside a word, a Cyrillic
letter that looks Latin, an accent. `fold(text)` undoes that so that a check
written for plain ASCII sees what a reader sees. Each grapheme (a character
and the combining marks after it) is folded on its own:

1. Unicode NFKC: compatibility forms to their plain letters and digits (fullwidth, mathematical, circled,
   superscript, ligatures), a base and its marks composed (`=` + U+0338 is `≠`);
2. a digit struck through with a combining overlay (`4̶`) dropped, as crossed out;
   Unicode tag characters (U+E0020-E007E, invisible, but a model's tokenizer reads them as the ASCII they
   shadow) as that ASCII; other format characters (category Cf: zero-width spaces and joiners, soft
   hyphens, bidi controls) and stray combining marks dropped;
3. decimal digits of every script as ASCII digits, and a number sign NFKC leaves alone (`➒`, `❾`) as its
   value; the accents of a letter dropped (`é` is `e`);
4. a character whose UTS #39 skeleton is an ASCII character's skeleton mapped to that ASCII character (the
   Cyrillic `с` is `c`), from Unicode's confusables table (data/confusables.txt, version 17.0.0, see
   data/README.md), or, failing that, its other case's skeleton (Cherokee `ꮪ`) or the Latin letter its
   Unicode name says it is styled from (the small capital `ᴇ`, the squared `🆂`); any other character kept
   as it is (Chinese stays Chinese).

A digit in another style than the digit before it is kept apart from it, so that no fold joins two numbers
a reader sees apart: `4²` is `4^2` (a power), `3½` is `3 1/2`, `①②` is `1 2`; a run of one style stays
one number (`¹⁰` is `10`).

ASCII text is its own fold. Because the fold works per grapheme, `fold_with_offsets` also says which
characters of the original each folded character comes from, for checks that cut the original text.
The judge model reads the original text (escaped): the fold is what checks read, not what anyone is shown.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
from dataclasses import dataclass
from importlib import resources

CONFUSABLES_FILE = "confusables.txt"
# Combining marks that belong to the character before them.
_MARKS = ("Mn", "Me", "Mc")
# ASCII characters in the order they are preferred when several share a skeleton ("l", "I" and "1" do).
_ASCII_PREFERENCE = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation + " "
# Combining overlays that strike a character through (short and long stroke, solidus, vertical and
# reverse solidus).
_STRIKES = frozenset("\u0334\u0335\u0336\u0337\u0338\u20d2\u20d3\u20e5\u20e6")
# Tag characters shadow printable ASCII one for one (U+E0041 is "A").
_TAGS = range(0xE0020, 0xE007F)
_TAG_OFFSET = 0xE0000
# A Latin letter in a style the confusables table leaves out, by its Unicode name: "LATIN LETTER SMALL CAPITAL
# R", "NEGATIVE SQUARED LATIN CAPITAL LETTER S", "REGIONAL INDICATOR SYMBOL LETTER S".
_STYLED_LATIN = re.compile(
    r"^(?:(?:NEGATIVE |DOUBLE )?(?:SQUARED|CIRCLED|PARENTHESIZED) |MODIFIER |REGIONAL INDICATOR SYMBOL )?"
    r"(?:LATIN )?(?:(?P<case>CAPITAL|SMALL) )?LETTER (?P<small_capital>SMALL CAPITAL )?(?P<letter>[A-Z])$"
)


@functools.cache
def prototypes() -> dict[str, str]:
    """The confusables table: one code point -> the sequence it is confusable with."""
    text = (resources.files("appliance.rewards") / "data" / CONFUSABLES_FILE).read_text(encoding="utf-8-sig")
    table = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split(";")
        if len(fields) < 2 or not fields[0].strip():
            continue
        source, target = fields[0].strip(), fields[1].split()
        table[chr(int(source, 16))] = "".join(chr(int(point, 16)) for point in target)
    return table


def skeleton(text: str) -> str:
    """The UTS #39 skeleton: NFD, each character replaced by its prototype, NFD again."""
    table = prototypes()
    mapped = "".join(table.get(character, character) for character in unicodedata.normalize("NFD", text))
    return unicodedata.normalize("NFD", mapped)


@functools.cache
def _ascii_by_skeleton() -> dict[str, tuple[str, ...]]:
    """Skeleton -> the ASCII characters that have it, in _ASCII_PREFERENCE's order."""
    found: dict[str, tuple[str, ...]] = {}
    for character in _ASCII_PREFERENCE:
        found[skeleton(character)] = found.get(skeleton(character), ()) + (character,)
    return found


def _ascii_look_alike(character: str) -> str | None:
    """The ASCII character with the skeleton of `character`, in its case where several share it (the Greek
    capital iota is "I", not "l")."""
    candidates = _ascii_by_skeleton().get(skeleton(character))
    if not candidates:
        return None
    same_case = [c for c in candidates if c.isupper() == character.isupper() and c.isalpha() == character.isalpha()]
    return (same_case or candidates)[0]


@functools.lru_cache(maxsize=1 << 16)
def fold_grapheme(grapheme: str) -> str:
    """One character with its combining marks, folded (see the module docstring)."""
    if grapheme.isascii():
        return grapheme
    if _digit_style(grapheme) and any(mark in _STRIKES for mark in grapheme[1:]):
        return ""  # a digit drawn struck through is crossed out: no digit to any reader
    out = []
    for character in unicodedata.normalize("NFKC", grapheme):
        if character.isascii():
            out.append(character)
            continue
        if ord(character) in _TAGS:
            out.append(chr(ord(character) - _TAG_OFFSET))
            continue
        category = unicodedata.category(character)
        if category == "Cf" or category in _MARKS:
            continue
        if category == "Nd":
            out.append(str(unicodedata.decimal(character)))
            continue
        value = unicodedata.numeric(character, None) if category == "No" else None
        if value is not None and value >= 0 and value == int(value):
            out.append(str(int(value)))
            continue
        if category.startswith("L"):
            character = _without_accents(character)
            if character.isascii():
                out.append(character)
                continue
        out.append(_as_ascii(character))
    return "".join(out)


def _as_ascii(character: str) -> str:
    """The ASCII character `character` is a look-alike or a styled form of, else `character` itself."""
    for variant in (character, character.lower(), character.upper()):
        found = _ascii_look_alike(variant)
        if found is not None and (variant == character or found.isalpha()):
            return found if variant == character else _case_like(found, character)
    named = _STYLED_LATIN.match(unicodedata.name(character, ""))
    if named is None:
        return character
    letter = named.group("letter")
    return letter.lower() if named.group("case") == "SMALL" or named.group("small_capital") else letter


def _case_like(letter: str, character: str) -> str:
    """`letter` in the case `character` has (a lowercase Cherokee letter is a lowercase look-alike)."""
    return letter.lower() if character.islower() else letter.upper() if character.isupper() else letter


def _without_accents(letter: str) -> str:
    """A letter without its accents (NFD: the base letter, then marks); a letter that decomposes otherwise
    (a Hangul syllable into its jamo) is kept whole."""
    base, *rest = unicodedata.normalize("NFD", letter)
    return base if rest and all(unicodedata.category(mark) == "Mn" for mark in rest) else letter


@dataclass(frozen=True)
class Folded:
    """A folded text and, per folded character, the span of original characters it comes from."""

    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def original(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original text that folded characters [start, end) come from."""
        if start >= end:
            at = self.starts[start] if start < len(self.starts) else (self.ends[-1] if self.ends else 0)
            return at, at
        return self.starts[start], self.ends[end - 1]


def _digit_style(grapheme: str) -> str | None:
    """How a grapheme writes a digit: "plain" (any script's decimal digit), "superscript", "subscript",
    "alone" (a number sign of its own: `①`, `½`, `➒`), or None for no digit."""
    character = grapheme[0]
    if character.isascii():
        return "plain" if character.isdigit() else None
    category = unicodedata.category(character)
    if category == "Nd":
        return "plain"
    if category != "No" or unicodedata.numeric(character, None) is None:
        return None
    name = unicodedata.name(character, "")
    return "superscript" if "SUPERSCRIPT" in name else "subscript" if "SUBSCRIPT" in name else "alone"


def _separator(before: str | None, style: str | None) -> str:
    """What keeps a digit apart from the digit before it when their styles differ ("" when they are one number)."""
    if before is None or style is None or (before == style and style != "alone"):
        return ""
    return "^" if style == "superscript" else " "


def _folded_graphemes(text: str):
    """(start, end, folded) per grapheme of a non-ASCII text, separators included (see the module docstring)."""
    before = None
    for start, end in graphemes(text):
        grapheme = text[start:end]
        style = _digit_style(grapheme)
        folded = fold_grapheme(grapheme)
        if folded:
            yield start, end, _separator(before, style) + folded
            before = style if folded[-1].isdigit() else None


def graphemes(text: str) -> list[tuple[int, int]]:
    """(start, end) of each character with the combining marks that follow it."""
    bounds: list[tuple[int, int]] = []
    for index, character in enumerate(text):
        if bounds and unicodedata.category(character) in _MARKS:
            bounds[-1] = (bounds[-1][0], index + 1)
        else:
            bounds.append((index, index + 1))
    return bounds


def fold_with_offsets(text: str) -> Folded:
    """The fold of `text`, with where each folded character comes from."""
    if text.isascii():
        positions = tuple(range(len(text)))
        return Folded(text, positions, tuple(position + 1 for position in positions))
    parts, starts, ends = [], [], []
    for start, end, folded in _folded_graphemes(text):
        parts.append(folded)
        starts.extend([start] * len(folded))
        ends.extend([end] * len(folded))
    return Folded("".join(parts), tuple(starts), tuple(ends))


def fold(text: str) -> str:
    """The folded form of `text` (see the module docstring); ASCII text is returned as it is."""
    if text.isascii():
        return text
    return "".join(folded for _, _, folded in _folded_graphemes(text))


def normalised(text: str) -> str:
    """The folded text with runs of whitespace as one space and no space next to a symbol: what makes two
    responses the same text ("9*5=45" and "9 * 5 = 45 ")."""
    out = []
    for token in fold(text).split():
        if out and (_symbolic(out[-1][-1]) or _symbolic(token[0])):
            out[-1] += token
        else:
            out.append(token)
    return " ".join(out)


def _symbolic(character: str) -> bool:
    return not (character.isalnum() or character == "_")
