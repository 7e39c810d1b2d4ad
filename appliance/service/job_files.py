"""Bounded reads of the files a worker writes in its job folder: JSON lines from the end or in step order.

Every read stops at a byte cap and a record count, so a 64 MiB judge log costs
one block-sized seek, not the whole file; the routes call these in a thread.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable

BLOCK = 64 * 1024
MAX_SCAN_BYTES = 16 * 1024 * 1024  # the most one request reads of a job file
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
            carry = lines.pop(0) if position > floor else b""
            rows = [row for row in _rows([x for x in lines if contains in x]) if keep is None or keep(row)]
            found = rows + found
        if carry and len(found) < limit:
            found = [row for row in _rows([carry]) if keep is None or keep(row)] + found
    return found[-limit:]


def records_after_step(path: Path, after_step: int, limit: int, max_bytes: int = MAX_SCAN_BYTES) -> list[dict]:
    """Up to `limit` + 1 records with a step past `after_step`, in file order (the extra one says there is more)."""
    with _READERS:
        return _after_step(path, after_step, limit, max_bytes)


def _after_step(path: Path, after_step: int, limit: int, max_bytes: int) -> list[dict]:
    found: list[dict] = []
    read = 0
    try:
        handle = open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return []
    with handle:
        for line in handle:
            read += len(line)
            if read > max_bytes:
                break
            rows = _rows([line])
            if rows and isinstance(rows[0].get("step", 0), int) and rows[0].get("step", 0) > after_step:
                found.append(rows[0])
                if len(found) > limit:
                    break
    return found
