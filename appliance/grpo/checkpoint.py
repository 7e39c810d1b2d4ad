"""Checkpoints that are complete or absent, and the best adapter so far.

A checkpoint is written into `checkpoints/.tmp-step-NNNNNN`, every file
fsynced, then renamed to `checkpoints/step-NNNNNN` (a rename within one
directory is atomic). A folder without the `step-` name, or without
state.json, is never read. `best/` is replaced the same way and never
touched by retention.
"""

from __future__ import annotations

from appliance.errors import ApplianceError, DiskFullError
import errno
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SCHEMA_VERSION = 1
STATE_FILE = "state.json"
PREFIX = "step-"


class CheckpointError(ApplianceError):
    pass


# Free space wanted before a checkpoint, relative to the last one's size (state.json and rounding).
DISK_MARGIN = 1.1
# How torch's zip writer reports a full disk: "enforce fail at inline_container.cc ... unexpected pos".
_TORCH_DISK_FULL = ("unexpected pos", "file write failed", "No space left")


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(marker in str(error) for marker in _TORCH_DISK_FULL)


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    state: dict


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    def __init__(self, job_dir: Path, keep_last: int):
        self.root = Path(job_dir) / "checkpoints"
        self.best_dir = Path(job_dir) / "best"
        self.keep_last = keep_last

    def complete(self) -> list[CheckpointInfo]:
        found = []
        if not self.root.is_dir():
            return found
        for folder in self.root.iterdir():
            if not folder.name.startswith(PREFIX) or not (folder / STATE_FILE).is_file():
                continue
            state = json.loads((folder / STATE_FILE).read_text())
            found.append(CheckpointInfo(int(state["step"]), folder, state))
        return sorted(found, key=lambda info: info.step)

    def latest(self) -> CheckpointInfo | None:
        complete = self.complete()
        if not complete:
            return None
        latest = complete[-1]
        if latest.state.get("schema_version") != SCHEMA_VERSION:
            raise CheckpointError(
                f"{latest.path} has checkpoint schema {latest.state.get('schema_version')}, this appliance reads "
                f"{SCHEMA_VERSION}; resume it with the appliance version that wrote it"
            )
        return latest

    def save(self, step: int, write_payload, state: dict) -> Path:
        """write_payload(folder) writes adapter/optimizer/...; state.json is written last.

        Raises DiskFullError, before writing anything, when the disk has less room
        than the last checkpoint took, and when a write fails for lack of space
        (the partial folder is removed; earlier checkpoints are untouched).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{PREFIX}{step:06d}"
        staging = self.root / f".tmp-{PREFIX}{step:06d}"
        shutil.rmtree(staging, ignore_errors=True)
        needed = self.estimated_bytes()
        free = shutil.disk_usage(self.root).free
        if needed and free < needed * DISK_MARGIN:
            raise DiskFullError(self.root, int(needed * DISK_MARGIN), free)
        try:
            staging.mkdir()
            write_payload(staging)
            (staging / STATE_FILE).write_text(json.dumps({"schema_version": SCHEMA_VERSION, "step": step, **state},
                                                         indent=2))
            _fsync_tree(staging)
        except (OSError, RuntimeError) as error:
            if not _is_disk_full(error):
                raise
            shutil.rmtree(staging, ignore_errors=True)
            raise DiskFullError(self.root, needed or None, shutil.disk_usage(self.root).free) from error
        if final.exists():  # a re-run of the same step after resume: replace it
            shutil.rmtree(final)
        os.replace(staging, final)
        self._fsync_root()
        self._retain()
        return final

    def estimated_bytes(self) -> int:
        """What the next checkpoint will take: the size of the newest complete one (0 when there is none)."""
        complete = self.complete()
        if not complete:
            return 0
        return sum(path.stat().st_size for path in complete[-1].path.rglob("*") if path.is_file())

    def update_best(self, adapter_source: Path, state: dict) -> None:
        """Copy an adapter folder to best/ atomically."""
        staging = self.best_dir.with_name(".tmp-best")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(adapter_source, staging)
        (staging / "best.json").write_text(json.dumps(state, indent=2))
        _fsync_tree(staging)
        previous = self.best_dir.with_name(".old-best")
        shutil.rmtree(previous, ignore_errors=True)
        if self.best_dir.exists():
            os.replace(self.best_dir, previous)
        os.replace(staging, self.best_dir)
        shutil.rmtree(previous, ignore_errors=True)

    def best_state(self) -> dict | None:
        for folder in (self.best_dir, self.best_dir.with_name(".old-best")):
            if (folder / "best.json").is_file():
                return json.loads((folder / "best.json").read_text())
        return None

    def _retain(self) -> None:
        for info in self.complete()[:-self.keep_last]:
            shutil.rmtree(info.path, ignore_errors=True)
        for leftover in self.root.glob(f".tmp-{PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def _fsync_root(self) -> None:
        directory = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
