"""Durable files: a file written whole or not at all, and the fsync of a folder after a rename.

The checkpoints, the model store's manifests, the daemon's job files and the
external-rollout job files all write through here. Standard library only, so
that the daemon's modules can use it without torch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Make the names in `folder` (a rename, a new file, a removal) durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path` whole or not at all, durably: a temporary file in the same folder (created with
    `mode`), fsynced, renamed over `path`, then the folder fsynced. A crash leaves the old file or the new one,
    and at worst a temporary file that `is_temporary` recognises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # In the same folder (a rename across file systems is not atomic), named apart per process and call, hidden.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    # O_EXCL: never write through a file or link someone placed at that name; `mode` is set at creation.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # the rename itself is durable only once the folder is


def is_temporary(path: Path) -> bool:
    """A file `write_atomically` left behind when the process died before its rename (never a finished file)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")
