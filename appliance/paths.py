"""Where the appliance keeps its state: the data directory and its layout (DESIGN.md)."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from appliance.errors import ApplianceError

SYSTEM_DATA_DIR = Path("/var/lib/appliance")
# State folders are owner/group-only: the group reaches the daemon through its socket, others not at all.
STATE_DIR_MODE = 0o750
STATE_FILE_MODE = 0o640


class DataDirError(ApplianceError):
    """The data directory belongs to another user (or is not a folder): the appliance will not use it."""


def default_data_dir() -> Path:
    """$APPLIANCE_DATA_DIR, else /var/lib/appliance when writable, else ./.appliance (refused when another
    user made it: a shared working folder must not hand its state to whoever created .appliance first)."""
    from_env = os.environ.get("APPLIANCE_DATA_DIR")
    if from_env:
        return Path(from_env)
    if SYSTEM_DATA_DIR.is_dir() and os.access(SYSTEM_DATA_DIR, os.W_OK):
        return SYSTEM_DATA_DIR
    fallback = Path(".appliance")
    if fallback.exists() or fallback.is_symlink():
        check_owner(fallback)
    return fallback


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_owner(path: Path) -> None:
    """Refuse a data dir that is not a folder of this user's (a link is judged by where it leads)."""
    try:
        info = path.stat()
    except OSError as error:
        raise DataDirError(f"cannot use the data dir {path}: {error.strerror}") from error
    if not stat.S_ISDIR(info.st_mode):
        raise DataDirError(f"the data dir {path} is not a folder; pass --data-dir FOLDER")
    if info.st_uid != os.geteuid():
        raise DataDirError(
            f"the data dir {path} belongs to {_user(info.st_uid)}, not to {_user(os.geteuid())}: "
            "run as its owner, or pass --data-dir (or set APPLIANCE_DATA_DIR) to a folder you own"
        )


def own_data_dir(path: Path) -> Path:
    """The data dir, created owner/group-only when missing and refused when another user owns it.

    Others lose their access to one that is ours (from before state folders were 0750)."""
    path = Path(path)
    path.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    check_owner(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o007:  # an existing folder keeps its owner and group bits; only others lose theirs
        os.chmod(path, mode & ~0o007)
    return path


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
