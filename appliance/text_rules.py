"""The one rule for strings a caller writes (job files, request fields, dataset rows), and escaping for terminals.

A string may not hold C0 control characters (U+0000-U+001F, NUL included), DEL,
C1 control characters (U+0080-U+009F) or lone surrogates (U+D800-U+DFFF): they
steer terminals (titles, clipboards, screen clears), break UTF-8 encoders and
hide text. Prose (a system prompt, a rubric, a dataset question) may also hold
tab and newline; a single value (a name, a path, a key) may not.

`escaped` is the other side: what a client prints of text it did not write
(daemon answers, logs, model output) with every such character made visible.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

# Everything the rule refuses in a single-line value; prose also allows \t and \n.
_NOT_IN_LINE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_NOT_IN_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# Printed escaped too: bidi overrides, embeddings and isolates reorder what follows them on the line (another
# member's sample or reason could show a command or a name other than the one it holds).
_BIDI = "\u202a-\u202e\u2066-\u2069"
_SHOWN_ESCAPED_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff{_BIDI}]")
_SHOWN_ESCAPED_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff{_BIDI}]")


def first_bad(value: str, multiline: bool = False) -> int | None:
    """The index of the first character of `value` the rule refuses, or None."""
    found = (_NOT_IN_TEXT if multiline else _NOT_IN_LINE).search(value)
    return None if found is None else found.start()


def text_problem(value: str, multiline: bool = False) -> str | None:
    """Why `value` breaks the rule (one phrase naming the first bad character and where), or None."""
    found = (_NOT_IN_TEXT if multiline else _NOT_IN_LINE).search(value)
    if found is None:
        return None
    code = ord(found.group())
    kind = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "a control character"
    allowed = "tab and newline are the only ones allowed here" if multiline else "write it on one line, as plain text"
    return f"contains {kind} (U+{code:04X}) at character {found.start() + 1}; {allowed}"


def _line(value: str) -> str:
    problem = text_problem(value, multiline=False)
    if problem:
        raise ValueError(problem)
    return value


def _text(value: str) -> str:
    problem = text_problem(value, multiline=True)
    if problem:
        raise ValueError(problem)
    return value


def Line(max_length: int, min_length: int = 0):  # noqa: N802 (a type factory reads as a type)
    """A single-line string of at most `max_length` characters under the rule."""
    return Annotated[str, Field(min_length=min_length, max_length=max_length), AfterValidator(_line)]


def Text(max_length: int):  # noqa: N802
    """Prose (tab and newline allowed) of at most `max_length` characters under the rule."""
    return Annotated[str, Field(max_length=max_length), AfterValidator(_text)]


def escaped(text: str, multiline: bool = True) -> str:
    """`text` for a terminal: every character the rule refuses, and every bidi override or isolate, written as
    \\xNN, \\uNNNN (newline and tab kept when `multiline`, a carriage return read as a line break: it could
    otherwise overwrite a line shown)."""
    if multiline:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    pattern = _SHOWN_ESCAPED_TEXT if multiline else _SHOWN_ESCAPED_LINE
    return pattern.sub(_visible, text)


def _visible(found: re.Match) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
