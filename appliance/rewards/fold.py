"""The folded form of a text: what every check of a response reads (the judge's guard, group dedup, rule rewards).

A student can spell what a check looks for in ways a reader does not notice:
fullwidth or mathematical letters, a zero-width space inside a word, a Cyrillic
letter that looks Latin, an accent. `fold(text)` undoes that so that a check
written for plain ASCII sees what a reader sees. Each grapheme (a character
and the combining marks after it) is folded on its own:

1. Unicode NFKC: compatibility forms to their plain letters and digits (fullwidth, mathematical, circled,
   superscript, ligatures), a base and its marks composed (`=` + U+0338 is `≠`);
2. format characters (category Cf: zero-width spaces and joiners, soft hyphens, bidi controls) and stray
   combining marks dropped;
3. decimal digits of every script as ASCII digits; the accents of a letter dropped (`é` is `e`);
4. a character whose UTS #39 skeleton is an ASCII character's skeleton mapped to that ASCII character (the
   Cyrillic `с` is `c`), from Unicode's confusables table (data/confusables.txt, version 17.0.0, see
   data/README.md); any other character kept as it is (Chinese stays Chinese).

ASCII text is its own fold. Because the fold works per grapheme, `fold_with_offsets` also says which
characters of the original each folded character comes from, for checks that cut the original text.
The judge model reads the original text (escaped): the fold is what checks read, not what anyone is shown.
"""

from __future__ import annotations

import functools
import string
import unicodedata
from dataclasses import dataclass
from importlib import resources

CONFUSABLES_FILE = "confusables.txt"
# Combining marks that belong to the character before them.
_MARKS = ("Mn", "Me", "Mc")
# ASCII characters in the order they are preferred when several share a skeleton ("l", "I" and "1" do).
_ASCII_PREFERENCE = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation + " "


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
def _ascii_by_skeleton() -> dict[str, str]:
    found: dict[str, str] = {}
    for character in _ASCII_PREFERENCE:
        found.setdefault(skeleton(character), character)
    return found


@functools.lru_cache(maxsize=1 << 16)
def fold_grapheme(grapheme: str) -> str:
    """One character with its combining marks, folded (see the module docstring)."""
    if grapheme.isascii():
        return grapheme
    out = []
    for character in unicodedata.normalize("NFKC", grapheme):
        if character.isascii():
            out.append(character)
            continue
        category = unicodedata.category(character)
        if category == "Cf" or category in _MARKS:
            continue
        if category == "Nd":
            out.append(str(unicodedata.decimal(character)))
            continue
        if category.startswith("L"):
            character = _without_accents(character)
            if character.isascii():
                out.append(character)
                continue
        out.append(_ascii_by_skeleton().get(skeleton(character), character))
    return "".join(out)


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
    for start, end in graphemes(text):
        folded = fold_grapheme(text[start:end])
        parts.append(folded)
        starts.extend([start] * len(folded))
        ends.extend([end] * len(folded))
    return Folded("".join(parts), tuple(starts), tuple(ends))


def fold(text: str) -> str:
    """The folded form of `text` (see the module docstring); ASCII text is returned as it is."""
    if text.isascii():
        return text
    return "".join(fold_grapheme(text[start:end]) for start, end in graphemes(text))


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
