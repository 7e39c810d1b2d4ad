"""Where the appliance keeps its state: the data directory and its layout (DESIGN.md)."""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_DATA_DIR = Path("/var/lib/appliance")


def default_data_dir() -> Path:
    """$APPLIANCE_DATA_DIR, else /var/lib/appliance when writable, else ./.appliance."""
    from_env = os.environ.get("APPLIANCE_DATA_DIR")
    if from_env:
        return Path(from_env)
    if SYSTEM_DATA_DIR.is_dir() and os.access(SYSTEM_DATA_DIR, os.W_OK):
        return SYSTEM_DATA_DIR
    return Path(".appliance")


def models_dir(data_dir: Path) -> Path:
    """$APPLIANCE_MODELS_DIR (the image mounts the store read-only at /models), else <data-dir>/models."""
    from_env = os.environ.get("APPLIANCE_MODELS_DIR")
    if from_env:
        return Path(from_env)
    return Path(data_dir) / "models"


def jobs_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "jobs"


def plugins_dir(data_dir: Path) -> Path:
    """Reward and environment plugins an administrator installed: the only caller code the daemon runs."""
    return Path(data_dir) / "plugins"


def datasets_dir(data_dir: Path) -> Path:
    """The default allowed root for dataset paths named in submitted jobs."""
    return Path(data_dir) / "datasets"


def uploads_dir(data_dir: Path) -> Path:
    """Dataset files uploaded with a submission."""
    return Path(data_dir) / "uploads"


def exports_dir(data_dir: Path) -> Path:
    """Where the daemon writes exports (a folder name per export, never a caller's path)."""
    return Path(data_dir) / "exports"


# ----- inside one job's folder (<data-dir>/jobs/<id>/, or the folder `appliance train` was given) -----


def submitted_groups_dir(job_dir: Path) -> Path:
    """Trajectory groups an external-rollout job accepted and has not yet trained into a checkpoint."""
    return Path(job_dir) / "submitted"


def served_ledger_file(job_dir: Path) -> Path:
    """The record of completions an external-rollout job's endpoint served (its served-token ledger)."""
    return Path(job_dir) / "served.jsonl"
