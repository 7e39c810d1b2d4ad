"""Reading a file someone else named, with a byte cap: never more than the cap, never a FIFO or a device.

What the daemon reads on a caller's behalf (a model's config.json, a plugin's
source, a token file) is read through here: the file is opened without
blocking (a FIFO would otherwise wait for a writer), must be a regular file,
and at most `max_bytes` are read, whatever its size (a sparse file claims any).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from appliance.errors import ApplianceError

MAX_MODEL_CONFIG_BYTES = 1 * 2**20  # a model's config.json, tokenizer_config.json
MAX_SOURCE_BYTES = 4 * 2**20  # a plugin's Python source, parsed (never run) by the checks


class FileTooLarge(ApplianceError):
    """The file is over its cap (or is not a regular file); the message names it and the cap."""


def read_capped(path: str | Path, max_bytes: int, follow_links: bool = True) -> bytes:
    """The whole file at `path`, or FileTooLarge when it holds more than `max_bytes` or is not a regular file.
    OSError (missing, unreadable, a link when `follow_links` is False) is the caller's to word."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise FileTooLarge(f"{path} is not a regular file")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(descriptor, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise FileTooLarge(f"{path} is over the limit of {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(descriptor)
