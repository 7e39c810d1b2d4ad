"""Remember judge verdicts within a job, so identical inputs are judged once.

Keys are digests of everything that decides a verdict (mode, rubric, question,
reference and the response or the whole ordered group), so a changed rubric
or reference never reuses an old score. Only validated verdicts are stored:
fallbacks depend on the rest of the group and are recomputed each time. The
cache is bounded (least recently used entries go first) and lives in memory
for the life of one Judge, i.e. one job run.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Generic, TypeVar

Value = TypeVar("Value")


def cache_key(*parts: object) -> str:
    """A stable digest of JSON-serialisable parts (order matters)."""
    # Compact separators and no ASCII escaping: one encoding per value, so equal inputs give equal digests.
    encoded = json.dumps(parts, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


class VerdictCache(Generic[Value]):
    """A least-recently-used map from cache_key() digests to verdicts."""

    def __init__(self, max_entries: int = 65536, enabled: bool = True):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self.enabled = enabled
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, Value] = OrderedDict()

    def get(self, key: str) -> Value | None:
        if not self.enabled:
            return None
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: str, value: Value) -> None:
        if not self.enabled:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
