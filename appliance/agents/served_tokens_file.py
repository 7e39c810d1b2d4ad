"""The served-token ledger on disk (`<job>/served.jsonl`, paths.served_ledger_file): it outlives the worker.

An append-only JSON-lines file, owner-only (0600). One line per served
completion, with what the check needs:

    {"key": "<sha256 hex of prompt and completion ids>", "text": "...", "logprobs": [...], "step": 3}

(with "finish_reason": "length" when the engine cut it at max_tokens)
(the same completion served again is one more line with the same key: it may
then be submitted twice), and one line per accepted submission naming the
completions it used, a key once per use:

    {"used": ["<key>", ...]}
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from appliance.agents.private_files import write_private

log = logging.getLogger(__name__)

KEY_HEX_LENGTH = 64  # a sha256 digest in hex


def served_line(
    key: bytes,
    text: str,
    logprobs: Iterable[float],
    step: int,
    used: int = 0,
    served: int | None = None,
    sampling: dict | None = None,
    finish_reason: str = "stop",
) -> dict[str, Any]:
    """A served completion; a rewrite adds how often it was served and used (an append: one serve, unused)."""
    line = {"key": key.hex(), "text": text, "logprobs": list(logprobs), "step": step}
    if sampling is not None:
        line["sampling"] = sampling
    if finish_reason != "stop":
        line["finish_reason"] = finish_reason
    if served is not None:
        line.update(served=served, used=used)
    return line


def _is_key(value: Any) -> bool:
    return isinstance(value, str) and len(value) == KEY_HEX_LENGTH and all(c in "0123456789abcdef" for c in value)


def _valid(record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    if "used" in record and "key" not in record:
        return isinstance(record["used"], list) and all(_is_key(key) for key in record["used"])
    return (
        _is_key(record.get("key"))
        and isinstance(record.get("text"), str)
        and isinstance(record.get("logprobs"), list)
        and all(isinstance(value, (int, float)) for value in record["logprobs"])
        and isinstance(record.get("step"), int)
        and isinstance(record.get("finish_reason", "stop"), str)
        and all(isinstance(record.get(count, 0), int) and record.get(count, 0) >= 0 for count in ("used", "served"))
    )


class LedgerFile:
    """Appends and rewrites of one ledger file; its owner (ServedLedger) serialises the calls.

    A served line is written (not fsynced) before the reply leaves the endpoint, so it survives the worker's
    crash (the kernel has it) though not a power cut; a used line is fsynced before the submit call answers.
    Loading replays the lines in order; a line that does not parse (a write cut short) is skipped with a log
    line. The file is then rewritten with the entries kept (with "served" and "used" counts), and again whenever
    it grows past twice the ledger's capacity, so it stays bounded like the ledger.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lines = 0  # lines in the file now: the owner rewrites it when this passes its bound
        self._descriptor: int | None = None

    def read(self) -> Iterator[dict[str, Any]]:
        """The file's records in order; damaged lines skipped, each with a log line."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":  # the newline that ends the last complete line
            lines.pop()
        for number, raw in enumerate(lines, start=1):
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                record = None
            if not _valid(record):
                why = " (a write cut short by a crash)" if number == len(lines) else ""
                log.warning(
                    "served ledger %s: line %d of %d is damaged%s and was ignored; a completion it named"
                    " can no longer be submitted",
                    self.path,
                    number,
                    len(lines),
                    why,
                )
                continue
            yield record

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the file by `records` (atomically, fsynced); later appends go to the new file."""
        self.close()
        text = "".join(json.dumps(record) + "\n" for record in records)
        write_private(self.path, text)
        self.lines = text.count("\n")

    def append(self, record: dict[str, Any], durable: bool = False) -> None:
        if self._descriptor is None:
            # Created owner-only: the file holds served text, which is the job's data.
            self._descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        data = (json.dumps(record) + "\n").encode("utf-8")
        while data:  # os.write may write less than asked; the rest follows until the line is whole
            data = data[os.write(self._descriptor, data) :]
        self.lines += 1
        if durable:
            os.fsync(self._descriptor)

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
