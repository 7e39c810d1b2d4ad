"""A scratch data dir for a bench run that sees the provisioned model store: its models/ links each model."""

from __future__ import annotations

from pathlib import Path


def link_model_store(store: Path, data_dir: Path) -> None:
    """Create `data_dir`/models with a link to every model of `store`/models (hidden staging folders skipped)."""
    (Path(data_dir) / "models").mkdir(parents=True)
    for model in (Path(store) / "models").iterdir():
        if not model.name.startswith("."):
            (Path(data_dir) / "models" / model.name).symlink_to(model.resolve())
