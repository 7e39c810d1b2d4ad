"""Private files in a job folder: owner-only (0600), written whole or not at all, fsynced.

The endpoint file, the served-token ledger and the queue of submitted
trajectory groups are written through these helpers. Standard library only:
the daemon reads endpoint.json without loading an engine.
"""

from __future__ import annotations

from pathlib import Path

from appliance.durable import write_atomically


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by the owner only, whole or not at all, fsynced with its folder."""
    write_atomically(path, text, mode=0o600)


def private_dir(folder: Path) -> Path:
    """`folder`, created owner-only (0700) when missing."""
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder
