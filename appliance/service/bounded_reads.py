"""Bounded reads of the files a worker writes in its job folder: JSON lines from the end or in step order.

Every read stops at a byte cap and a record count, so a long judge log costs
one block-sized seek, not the whole file; the routes call these in a thread.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Callable

from appliance.bounded_file import FileTooLarge, read_capped
from appliance.service.api import CheckpointInfo, LogChunk

BLOCK = 64 * 1024  # files are read backwards from their end in blocks of this size
CHECKPOINT_DIR = re.compile(r"^step-(\d+)$")
MAX_SCAN_BYTES = 16 * 1024 * 1024  # the most one request reads of a job file
MAX_LINE_BYTES = 1024 * 1024  # a longer line is read (and skipped) in parts
# Two scans at a time: more only contend for the GIL with the event loop (and /status with it).
_READERS = threading.BoundedSemaphore(2)


def _rows(lines: list[bytes]) -> list[dict]:
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a line being written right now
        if isinstance(row, dict):
            rows.append(row)
    return rows


def tail_records(
    path: Path,
    limit: int,
    keep: Callable[[dict], bool] | None = None,
    contains: bytes = b"",
    max_bytes: int = MAX_SCAN_BYTES,
) -> list[dict]:
    """The last `limit` records of a JSON-lines file (those `keep` accepts), oldest first, reading from the end.

    Only lines holding `contains` are parsed (a cheap filter before `keep`)."""
    with _READERS:
        return _tail(path, limit, keep, contains, max_bytes)


def _tail(path: Path, limit: int, keep, contains: bytes, max_bytes: int) -> list[dict]:
    try:
        handle = open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return []
    found: list[dict] = []
    with handle:
        position = os.fstat(handle.fileno()).st_size
        floor = max(0, position - max_bytes)
        carry = b""
        while position > floor and len(found) < limit:
            start = max(floor, position - BLOCK)
            handle.seek(start)
            data = handle.read(position - start) + carry
            position = start
            lines = data.split(b"\n")
            # The block's first line may begin in the block before: carried over and completed by the next read.
            carry = lines.pop(0) if position > floor else b""
            rows = [row for row in _rows([x for x in lines if contains in x]) if keep is None or keep(row)]
            found = rows + found
        if carry and len(found) < limit:  # the file's (or the scan's) first line, never completed by a later read
            found = [row for row in _rows([carry]) if keep is None or keep(row)] + found
    return found[-limit:]


def records_after_step(path: Path, after_step: int, limit: int, max_bytes: int = MAX_SCAN_BYTES) -> list[dict]:
    """Up to `limit` + 1 records with a step past `after_step`, in file order (the extra one says there is more)."""
    with _READERS:
        return _after_step(path, after_step, limit, max_bytes)


def _stepped(line: bytes) -> tuple[int | None, dict | None]:
    """A record line's step (None when it has no integer step) and the record."""
    rows = _rows([line])
    step = rows[0].get("step") if rows else None
    return (step, rows[0]) if isinstance(step, int) else (None, None)


def _first_line_after(handle, size: int, after_step: int) -> int:
    """A line-start offset at or before the first record with a step past `after_step`.

    metrics.jsonl is in step order (a resume truncates it to the checkpoint's step first), so a
    bisection over byte offsets finds the page in a few block reads however long the file is;
    reading from the start would stop at the byte cap and never reach the newest steps."""
    low, high = 0, size
    while high - low > BLOCK:
        middle = (low + high) // 2
        handle.seek(middle)
        handle.readline(MAX_LINE_BYTES)  # the rest of the line the middle fell in
        step, _ = _stepped(handle.readline(MAX_LINE_BYTES))
        if step is not None and step <= after_step:
            low = middle
        else:
            high = middle
    handle.seek(low)
    if low:
        handle.readline(MAX_LINE_BYTES)
    return handle.tell()


def _after_step(path: Path, after_step: int, limit: int, max_bytes: int) -> list[dict]:
    found: list[dict] = []
    read = 0
    try:
        handle = open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return []
    with handle:
        handle.seek(_first_line_after(handle, os.fstat(handle.fileno()).st_size, after_step))
        while read < max_bytes:
            # Bounded: a line without a newline (a worker's plugin can write one) is read a part at a time.
            line = handle.readline(min(MAX_LINE_BYTES, max_bytes - read))
            if not line:
                break
            read += len(line)
            step, row = _stepped(line)
            if step is not None and step > after_step:
                found.append(row)
                if len(found) > limit:
                    break
    return found


MAX_JSON_FILE_BYTES = 1 << 20  # a small JSON file a worker writes (best/best.json)
LOG_END_BYTES = 64 * 1024  # what a failed job's reason may quote of its log's end


def json_file(path: Path) -> dict | None:
    """A small JSON object the worker wrote; None when missing, unreadable, not JSON or over its cap."""
    try:
        return json.loads(read_capped(path, MAX_JSON_FILE_BYTES))
    except (OSError, ValueError, FileTooLarge):
        return None


def log_end(path: Path, max_bytes: int = LOG_END_BYTES) -> str:
    """The last `max_bytes` of a log as text (a log may have grown to any size, or be sparse); OSError if absent."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - max_bytes))
        return handle.read(max_bytes).decode("utf-8", errors="replace")


def checkpoints(job_dir: Path) -> list[CheckpointInfo]:
    root = job_dir / "checkpoints"
    try:
        folders = sorted(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):  # none yet, or the job is being deleted as we look
        return []
    found = []
    for folder in folders:
        match = CHECKPOINT_DIR.match(folder.name)
        if match and (folder / "state.json").is_file():  # state.json is written last: complete
            found.append(CheckpointInfo(step=int(match[1]), path=str(folder)))
    return found


def read_log(job_id: str, path: Path, offset: int, max_bytes: int) -> LogChunk:
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            handle.seek(start)
            data = handle.read(max_bytes)
    except FileNotFoundError:
        return LogChunk(job_id=job_id, text="", offset=0, next_offset=0, size=0)
    text, consumed = complete_utf8(data)
    return LogChunk(
        job_id=job_id, text=text, offset=start, next_offset=start + consumed, size=max(size, start + len(data))
    )


def complete_utf8(data: bytes) -> tuple[str, int]:
    """The text of `data` and the bytes it used: a character cut at the end waits for the next read."""
    for cut in range(0, 4):  # a UTF-8 character is at most four bytes: at most three of it can be missing
        try:
            return data[: len(data) - cut].decode("utf-8"), len(data) - cut
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace"), len(data)
