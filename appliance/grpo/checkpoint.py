"""Checkpoints that are complete or absent, and the best adapter so far.

A checkpoint is written into `checkpoints/.tmp-step-NNNNNN`, every file and
folder fsynced, then renamed to `checkpoints/step-NNNNNN` (a rename within one
directory is atomic) and the parent fsynced. A folder without the `step-`
name, or without state.json, is never read. Retention renames an old
checkpoint to `.del-step-NNNNNN` before deleting it, so a crash mid-delete
never leaves a half-deleted folder under a name that resume would read.

`best/` is a symlink to `.best/step-NNNNNN/` (adapter + best.json); a new best
is written beside it and the link is flipped by one rename, so `best/` never
disappears. Everything here loads without pickle (torch.load weights_only).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from appliance.durable import fsync_dir
from appliance.errors import CheckpointError, DiskFullError


SCHEMA_VERSION = 2
STATE_FILE = "state.json"
BEST_FILE = "best.json"
PREFIX = "step-"
# What a complete checkpoint folder holds besides state.json.
PAYLOAD = ("adapter/adapter_model.safetensors", "adapter/adapter_config.json", "optimizer.pt", "scheduler.pt", "rng.pt")
# Free space wanted before a checkpoint, relative to the last one's size (state.json and rounding).
DISK_MARGIN = 1.1
# How torch's zip writer reports a full disk: "enforce fail at inline_container.cc ... unexpected pos".
_TORCH_DISK_FULL = ("unexpected pos", "file write failed", "No space left")


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    state: dict


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(marker in str(error) for marker in _TORCH_DISK_FULL)


def fsync_tree(folder: Path) -> None:
    """fsync every file and every folder below `folder`, deepest first, then `folder` itself."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(folder)


def remove_tree(folder: Path) -> None:
    """Delete a folder crash-safely: rename it to a `.del-` name first, then remove it."""
    if not folder.exists():
        return
    doomed = folder.with_name(f".del-{folder.name}")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(folder, doomed)
    fsync_dir(folder.parent)
    shutil.rmtree(doomed, ignore_errors=True)


# ----- RNG state as tensors and plain lists (loadable with weights_only=True) ------------------


def rng_state() -> dict:
    version, internal, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(int(v) for v in python["state"].tolist()), python["gauss"]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["name"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_tensors(path: Path):
    """torch.load without pickle: tensors and plain containers only (a job folder must not run code)."""
    return torch.load(path, weights_only=True, map_location="cpu")


class CheckpointManager:
    def __init__(self, job_dir: Path, keep_last: int):
        self.job_dir = Path(job_dir)
        self.root = self.job_dir / "checkpoints"
        self.best_dir = self.job_dir / "best"
        self.best_versions = self.job_dir / ".best"
        self.keep_last = keep_last

    # ----- reading ------------------------------------------------------------------------------

    def complete(self) -> list[CheckpointInfo]:
        """Checkpoints with a readable state.json of this schema, oldest first."""
        found = []
        if not self.root.is_dir():
            return found
        for folder in self.root.iterdir():
            if not folder.name.startswith(PREFIX) or not (folder / STATE_FILE).is_file():
                continue
            try:
                state = json.loads((folder / STATE_FILE).read_text())
                step = int(state["step"])
            except (ValueError, KeyError, TypeError, OSError):
                continue  # a damaged state.json: never the one to resume from
            found.append(CheckpointInfo(step, folder, state))
        return sorted(found, key=lambda info: info.step)

    def candidates(self) -> list[CheckpointInfo]:
        """Checkpoints to resume from, newest first. A newer schema is refused, not skipped."""
        ordered = list(reversed(self.complete()))
        if ordered and ordered[0].state.get("schema_version") != SCHEMA_VERSION:
            newest = ordered[0]
            raise CheckpointError(
                f"{newest.path} has checkpoint schema {newest.state.get('schema_version')}, this appliance reads "
                f"{SCHEMA_VERSION}; resume it with the appliance version that wrote it, or --restart"
            )
        return ordered

    def latest(self) -> CheckpointInfo | None:
        candidates = self.candidates()
        return candidates[0] if candidates else None

    @staticmethod
    def missing_files(info: CheckpointInfo) -> list[str]:
        return [name for name in PAYLOAD if not (info.path / name).is_file() or (info.path / name).stat().st_size == 0]

    # ----- writing ------------------------------------------------------------------------------

    def estimated_bytes(self) -> int:
        """What the next checkpoint will take: the size of the newest complete one (0 when there is none)."""
        complete = self.complete()
        if not complete:
            return 0
        return sum(path.stat().st_size for path in complete[-1].path.rglob("*") if path.is_file())

    def save(self, step: int, write_payload: Callable[[Path], None], state: dict) -> Path:
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
            (staging / STATE_FILE).write_text(
                json.dumps({"schema_version": SCHEMA_VERSION, "step": step, **state}, indent=2)
            )
            fsync_tree(staging)
        except (OSError, RuntimeError) as error:
            shutil.rmtree(staging, ignore_errors=True)
            if not _is_disk_full(error):
                raise
            raise DiskFullError(self.root, needed or None, shutil.disk_usage(self.root).free) from error
        if final.exists():  # a re-run of the same step after resume: replace it
            remove_tree(final)
        os.replace(staging, final)
        fsync_dir(self.root)
        self._retain()
        return final

    def _retain(self) -> None:
        for info in self.complete()[: -self.keep_last]:
            remove_tree(info.path)
        for leftover in list(self.root.glob(f".tmp-{PREFIX}*")) + list(self.root.glob(".del-*")):
            shutil.rmtree(leftover, ignore_errors=True)

    # ----- best adapter -------------------------------------------------------------------------

    def update_best(self, write_adapter: Callable[[Path], None], state: dict) -> Path:
        """Write a new best adapter beside the current one, then flip `best` to it with one rename."""
        self.best_versions.mkdir(parents=True, exist_ok=True)
        version = self.best_versions / f"{PREFIX}{int(state['step']):06d}"
        staging = self.best_versions / f".tmp-{version.name}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.mkdir()
            write_adapter(staging)
            (staging / BEST_FILE).write_text(json.dumps(state, indent=2))
            fsync_tree(staging)
        except (OSError, RuntimeError) as error:
            shutil.rmtree(staging, ignore_errors=True)
            if not _is_disk_full(error):
                raise
            raise DiskFullError(self.best_versions, None, shutil.disk_usage(self.job_dir).free) from error
        if version.exists() and not self._points_to(version):
            remove_tree(version)
        if not version.exists():
            os.replace(staging, version)
        else:  # rewriting the version `best` points at (a resumed run re-ran that step): swap through a new name
            shutil.rmtree(staging, ignore_errors=True)
        fsync_dir(self.best_versions)
        self._point_best_at(version)
        return version

    def _points_to(self, version: Path) -> bool:
        return self.best_dir.is_symlink() and self.best_dir.resolve() == version.resolve()

    def _point_best_at(self, version: Path) -> None:
        link = self.job_dir / ".best-link.tmp"
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.relpath(version, self.job_dir), link)
        if self.best_dir.exists() and not self.best_dir.is_symlink():
            remove_tree(self.best_dir)  # a best/ folder written by an older version
        os.replace(link, self.best_dir)
        fsync_dir(self.job_dir)
        for older in self.best_versions.iterdir():
            if older != version and not older.name.startswith(".del-"):
                remove_tree(older) if older.is_dir() else older.unlink()

    def best_state(self) -> dict | None:
        """best.json of the adapter `best/` shows (None when there is none or it is damaged)."""
        try:
            return json.loads((self.best_dir / BEST_FILE).read_text())
        except (OSError, ValueError):
            return None

    def reconcile_best(self, resumed: CheckpointInfo, repair: bool = True) -> dict | None:
        """On resume: the best state to continue with, repairing `best/` from the checkpoints when it is broken.

        best/ may be newer than the checkpoint (best is chosen at any step); an
        exact resume re-runs those steps and reaches the same values, so a
        readable best/ is kept. A missing or dangling one is rebuilt from the
        checkpoint of the best step the resumed state names, when it still exists.
        repair=False (a data-parallel rank after 0) answers what the repair gives without touching best/.
        """
        state = self.best_state()
        if state is not None and (self.best_dir / "adapter_model.safetensors").is_file():
            return state
        if repair and self.best_dir.is_symlink():
            self.best_dir.unlink()
        recorded = resumed.state.get("best")
        if not recorded:
            return None
        source = self.root / f"{PREFIX}{int(recorded['step']):06d}" / "adapter"
        if not source.is_dir():
            return None
        if repair:
            self.update_best(lambda folder: _copy_files(source, folder), recorded)
        return recorded


def _copy_files(source: Path, target: Path) -> None:
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, target / path.name)


# ----- what a checkpoint holds of a run: adapter, optimizer, scheduler, RNG (no pickle) ---------------------


def adapter_is_finite(student) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in student.trainable_parameters())


def write_adapter(student, folder: Path) -> None:
    """Save the adapter; refuses one holding NaN or inf (nothing non-finite reaches the disk)."""
    if not adapter_is_finite(student):
        raise CheckpointError("the adapter holds NaN or inf values; it was not saved (the previous one stays)")
    student.save_adapter(folder)


def write_payload(folder: Path, student, optimizer, scheduler) -> None:
    write_adapter(student, folder / "adapter")
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    torch.save(rng_state(), folder / "rng.pt")


def load_payload(folder: Path, student, optimizer, scheduler) -> None:
    """Read every file first, then apply: a damaged file raises before anything changes."""
    optimizer_state = load_tensors(folder / "optimizer.pt")
    scheduler_state = load_tensors(folder / "scheduler.pt")
    rng = load_tensors(folder / "rng.pt")
    student.load_adapter(folder / "adapter")
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    restore_rng_state(rng)


# ----- the world size a checkpoint was written by --------------------------------------------------------

WORLD_FILE = "world.json"


def rng_file(rank: int) -> str:
    """Each rank's RNG state in a data-parallel checkpoint (rng.pt is rank 0's too)."""
    return f"rng-rank{rank}.pt"


def check_world_size(job_dir: Path, world_size: int) -> None:
    """Refuse to resume a checkpoint written by another number of ranks (their RNG and shares differ)."""
    latest = CheckpointManager(job_dir, 1).latest()
    if latest is None:
        return
    world = latest.path / WORLD_FILE
    saved = json.loads(world.read_text())["world_size"] if world.is_file() else 1
    if saved != world_size:
        raise CheckpointError(
            f"checkpoint {latest.path.name} was written by {saved} data-parallel rank(s) and this run has "
            f"{world_size}; resume with resources giving {saved} rank(s), or --restart"
        )
