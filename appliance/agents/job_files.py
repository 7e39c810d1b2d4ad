"""Private files in a job folder: owner-only (0600), written whole or not at all, fsynced when they must outlive a crash.

The endpoint file, the served-token ledger and the queue of submitted
trajectory groups are written through these helpers. Standard library only:
the daemon reads endpoint.json without loading an engine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from appliance.durable import fsync_dir


def write_private(path: Path, text: str, *, durable: bool = True) -> None:
    """Write `text` to `path`, readable by the owner only, atomically; `durable`: fsync the file and its folder."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def is_temporary(path: Path) -> bool:
    """A file `write_private` left behind when the process died before its rename (never a finished file)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")


def private_dir(folder: Path) -> Path:
    """`folder`, created owner-only (0700) when missing."""
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder
