"""A fresh data dir that sees the provisioned model store, without copying or re-hashing the models.

Importable from any test as `store_support` (tests/ is on sys.path): a name no
conftest.py shadows, unlike `from conftest import ...` once several folders have one.
"""

from __future__ import annotations

import os
from pathlib import Path


def link_model_store(source_data_dir: Path, data_dir: Path) -> Path:
    """A fresh data dir whose models/ points at the provisioned store (no copy, no re-hashing)."""
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    for model in (source_data_dir / "models").iterdir():
        if not model.name.startswith("."):
            os.symlink(model, data_dir / "models" / model.name)
    return data_dir
