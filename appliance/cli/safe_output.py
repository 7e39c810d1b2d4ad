"""What `appliance jobs` prints is escaped: the daemon's answers (reasons, logs, samples, model output) may hold
control characters that would steer the terminal (title, clipboard, screen), so every character the string
rule refuses is written visibly instead (appliance/text_rules.py), whatever the daemon sends."""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Iterator

from appliance.text_rules import escaped


class EscapingWriter(io.TextIOBase):
    """A text stream that writes `escaped(text)` to the stream it wraps."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(escaped(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """sys.stdout and sys.stderr escaped for the duration."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingWriter(sys.stdout), EscapingWriter(sys.stderr)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved
