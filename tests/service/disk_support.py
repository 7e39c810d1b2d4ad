"""Filling a (small, test-mounted) file system, for the tests of what the daemon does when its disk is full."""

from __future__ import annotations

from pathlib import Path


def fill_disk(folder: Path) -> Path:
    """Fill the file system of `folder` with one file (returned: unlink it to free the space)."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:  # unbuffered: nothing left to fail at close
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError:
            pass
    return filler
