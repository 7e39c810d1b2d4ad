"""The judge log, `jobs/<id>/judge.jsonl`: one JSON line per judge request, bounded by rotation.

Rotation is the standard library's RotatingFileHandler: when the file would
pass `max_bytes` it becomes judge.jsonl.1 (older ones shift to .2, ...) and at
most `backups` old files are kept, so the log never holds more than about
max_bytes * (backups + 1) bytes. A line is never split across files.
"""

from __future__ import annotations

import json
import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

# Enough for many steps of judged prompts and their answers, bounded so a long job cannot fill the disk with it.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_BACKUPS = 3


class JudgeLog:
    """Appends records as JSON lines to a size-bounded, rotating file."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS):
        if max_bytes < 1:
            raise ValueError(f"judge log max_bytes must be at least 1, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"judge log backups must be 0 or more, got {backups}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # backupCount=0 would let the file grow without bound; with no backups we truncate instead.
        self._truncate_only = backups == 0
        self._handler = RotatingFileHandler(
            self.path, maxBytes=max_bytes, backupCount=max(backups, 1), encoding="utf-8", delay=True
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str)
        log_record = logging.makeLogRecord({"msg": line, "levelno": logging.INFO, "levelname": "INFO"})
        self._handler.handle(log_record)
        self._handler.flush()  # on disk when the call returns: the daemon reads the log while the job runs
        if self._truncate_only:
            self.path.with_name(self.path.name + ".1").unlink(missing_ok=True)

    def close(self) -> None:
        self._handler.close()
