"""Submitted trajectory groups on disk, from the submit call's "accepted" until the step that trained them is checkpointed.

An external-rollout job keeps each accepted group as one file in
`<job>/submitted/` (paths.submitted_groups_dir; folder 0700, files 0600):

    000000000012.json               accepted, waiting for a step
    000000000012.step-000007.json   taken by step 7 (renamed by `collect`)

The number is the order of acceptance. Each change is fsynced, folder too,
before it is answered or trained, so an accepted group survives a crash.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from appliance.agents.private_files import private_dir, write_private
from appliance.agents.trajectory import TrajectoryGroup
from appliance.durable import fsync_dir, is_temporary

log = logging.getLogger(__name__)

# Zero-padded numbers: sorting the names sorts the groups by acceptance.
_NAME = re.compile(r"^(?P<number>\d{12})(?:\.step-(?P<step>\d{6,}))?\.json$")


@dataclass
class Spooled:
    """One accepted group: its place in acceptance order and the step that took it (None while queued)."""

    number: int
    group: TrajectoryGroup
    taken_by: int | None = None


def _name(number: int, taken_by: int | None) -> str:
    return f"{number:012d}.json" if taken_by is None else f"{number:012d}.step-{taken_by:06d}.json"


class GroupSpool:
    """The accepted groups of one job, on disk; not thread-safe (its owner serialises calls)."""

    def __init__(self, folder: Path):
        self.folder = private_dir(folder)
        self._next = 0
        self._taken: dict[int, int] = {}  # number -> step, for the files named as taken

    def load(self) -> list[Spooled]:
        """Every group on disk, in acceptance order (call once, before anything is added).

        The job resumes from its newest checkpoint R and asks for step R + 1 first: a group taken by a step after
        R is queued again (the replayed steps train the same groups in the same order), and one taken by a step
        up to R was trained into that checkpoint and is deleted (the crash fell between the checkpoint and
        `drop_trained`). After a fallback past a damaged checkpoint, the groups of the steps in between are already
        deleted: those steps train on the next groups submitted. An unreadable file is renamed `*.damaged` (kept
        for inspection) with a log line, and the rest load.
        """
        entries = []
        for path in sorted(self.folder.iterdir()):
            if is_temporary(path):
                path.unlink(missing_ok=True)  # a write cut short before its rename: never accepted
                continue
            match = _NAME.match(path.name)
            if match is None:  # not ours (a *.damaged file kept for inspection, or anything else): left alone
                continue
            number = int(match["number"])
            taken_by = int(match["step"]) if match["step"] else None
            self._next = max(self._next, number + 1)  # even past a damaged file: its number is never reused
            try:
                group = TrajectoryGroup.model_validate_json(path.read_bytes())
            except (OSError, ValidationError, ValueError) as error:
                log.warning(
                    "submitted group %s cannot be read (%s: %s); renamed to %s.damaged and skipped",
                    path,
                    type(error).__name__,
                    str(error).splitlines()[0],
                    path.name,
                )
                os.replace(path, path.with_name(path.name + ".damaged"))
                continue
            if taken_by is not None:
                self._taken[number] = taken_by
            entries.append(Spooled(number, group, taken_by))
        entries.sort(key=lambda entry: entry.number)
        return entries

    def add(self, groups: list[TrajectoryGroup]) -> list[Spooled]:
        """Write `groups` durably, queued; returns them as spooled entries."""
        entries = []
        for group in groups:
            entry = Spooled(self._next, group)
            self._next += 1
            write_private(self.folder / _name(entry.number, None), group.model_dump_json())  # fsynced, folder too
            entries.append(entry)
        return entries

    def take(self, entries: list[Spooled], step: int) -> None:
        """Mark `entries` as taken by `step` (durably, before the step trains)."""
        # A rename per group, then one fsync of the folder: the renames are durable together before training.
        for entry in entries:
            os.replace(self.folder / _name(entry.number, entry.taken_by), self.folder / _name(entry.number, step))
            entry.taken_by = step
            self._taken[entry.number] = step
        if entries:
            fsync_dir(self.folder)

    def without_trained(self, entries: list[Spooled], step: int) -> list[Spooled]:
        """`entries` less those a step before `step` took, whose files are deleted.

        Called with the groups `load` gave back and the first step the restarted job asks for: a group taken
        by an earlier step was trained into the checkpoint the job resumed from, and must not train twice.
        """
        kept = []
        for entry in entries:
            if entry.taken_by is not None and entry.taken_by < step:
                (self.folder / _name(entry.number, entry.taken_by)).unlink(missing_ok=True)
                self._taken.pop(entry.number, None)
            else:
                kept.append(entry)
        return kept

    def drop_trained(self, through_step: int) -> int:
        """Delete the groups taken by steps up to `through_step` (now in a checkpoint); how many."""
        done = [number for number, step in self._taken.items() if step <= through_step]
        for number in done:
            (self.folder / _name(number, self._taken.pop(number))).unlink(missing_ok=True)
        return len(done)
