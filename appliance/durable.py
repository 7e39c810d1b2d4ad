"""Making a rename or a new file durable: the one fsync of a folder the checkpoints and job files share.

Standard library only, so that the daemon's modules can use it without torch.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Make the names in `folder` (a rename, a new file, a removal) durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
