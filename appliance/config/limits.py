"""The upper bounds of a job file: its size, and every number, list, string and mapping in it.

The bounds themselves are written once, in the schema's field types
(config/schema.py) from the constants below; `limits_table()` reads them back
from the schema, so the table that `appliance config check --limits` prints and
docs/limits.md shows cannot drift from what validation enforces. No caller
sizes the daemon's work: admission only counts (a multiply range, the rows of
a dataset), and what it counts is bounded here too.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

import annotated_types

MAX_JOB_FILE_BYTES = 256 * 1024  # read and refused before any parsing
MAX_NUMBER_CHARS = 64  # one number as written in the file; a longer one is refused before it is built
MAX_INTEGER = 2**63 - 1  # no key takes more; a larger integer is refused as the loader builds it
DEFAULT_MAX_UPLOAD_BYTES = 64 * 2**20  # an uploaded dataset; `appliance serve --max-upload` changes it
MAX_DATASET_ROW_BYTES = 1 * 2**20  # one line of a JSON Lines dataset
MAX_DATASET_ROWS = 1_000_000
MAX_MULTIPLY_PROBLEMS = 250_000  # (operand_max - operand_min + 1)^2, counted, never built
MAX_OPERAND = 1_000_000
MAX_STEPS = 1_000_000
MAX_TOKENS = 131_072
MAX_GROUP_SIZE = 256
MAX_PROMPTS_PER_STEP = 1024
MAX_KEEP_LAST = 100
MAX_SEED = 2**32 - 1  # every RNG the trainer seeds takes it
MAX_SECONDS = 86_400.0
MAX_TEMPERATURE = 10.0
MAX_WEIGHT = 1e6
MAX_DEVICES = 64
MAX_NODES = 256
MAX_MEMORY_BYTES = 2**50
MAX_LOG_BYTES = 2**30
MAX_REWARDS = 32
MAX_FEW_SHOT = 32
MAX_FEW_SHOT_CHARS = 4096
MAX_PROSE_CHARS = 16_384  # system_prompt, rubric
MAX_NAME_CHARS = 128
MAX_PATH_CHARS = 1024
MAX_URL_CHARS = 2048
MAX_OPTIONS = 64  # entries of environment_options, params, chat_template_kwargs
MAX_KEY_CHARS = 64
MAX_OPTION_CHARS = 1024
MAX_OPTION_NUMBER = 10**9


@dataclass(frozen=True)
class Limit:
    """One row of the table: a key path, what is bounded, and the bound."""

    key: str
    kind: str  # "integer" | "number" | "string" | "list" | "mapping" | "mapping key"
    low: float | None
    high: float | None
    open_low: bool = False  # the bound itself is excluded
    open_high: bool = False

    def text(self) -> str:
        unit = {"string": " characters", "list": " items", "mapping": " entries", "mapping key": " characters"}
        high = "unbounded" if self.high is None else ("< " if self.open_high else "") + _number(self.high)
        if self.low is None:
            return f"at most {high}{unit.get(self.kind, '')}"
        low = ("> " if self.open_low else "") + _number(self.low)
        return f"{low} .. {high}{unit.get(self.kind, '')}"


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:_}"
    return str(value)


def file_limits() -> list[Limit]:
    """Bounds on the file as a whole (before the schema sees it)."""
    return [
        Limit("(job file)", "bytes", None, MAX_JOB_FILE_BYTES),
        Limit("(any number, as written)", "characters", None, MAX_NUMBER_CHARS),
        Limit("(any integer)", "integer", -MAX_INTEGER, MAX_INTEGER),
        Limit("(uploaded dataset)", "bytes", None, DEFAULT_MAX_UPLOAD_BYTES),
        Limit("(dataset row)", "bytes", None, MAX_DATASET_ROW_BYTES),
        Limit("task.dataset (rows)", "rows", None, MAX_DATASET_ROWS),
        Limit("task.operand_min..operand_max", "problems", None, MAX_MULTIPLY_PROBLEMS),
    ]


def limits_table() -> list[Limit]:
    """Every bound of the job file: the file's own, then each key of the schema in order."""
    from appliance.config.schema import JobSpec

    rows = file_limits()
    _walk_model(JobSpec, "", rows)
    return rows


def _walk_model(model: Any, prefix: str, rows: list[Limit]) -> None:
    for name, info in model.model_fields.items():
        _walk(info.annotation, list(info.metadata), f"{prefix}{name}", rows)


def _walk(annotation: Any, metadata: list, key: str, rows: list[Limit]) -> None:
    """Add the bounds of one annotation (unions and Annotated unwrapped) under `key`."""
    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        _walk(inner, metadata + _flat(extra), key, rows)
    elif origin in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            _walk(member, metadata, key, rows)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        _walk_model(annotation, key + ".", rows)
    elif origin is list:
        rows.append(Limit(key, "list", *_range(metadata)))
        _walk(typing.get_args(annotation)[0], [], key + "[]", rows)
    elif origin is dict:
        key_type, value_type = typing.get_args(annotation)
        rows.append(Limit(key, "mapping", *_range(metadata)))
        _walk(key_type, [], key + " (key)", rows)
        _walk(value_type, [], key + ".*", rows)
    elif annotation is str:
        rows.append(Limit(key, "mapping key" if key.endswith("(key)") else "string", *_range(metadata)))
    elif annotation in (int, float) and annotation is not bool:
        rows.append(Limit(key, "integer" if annotation is int else "number", *_range(metadata)))


def _flat(metadata: list) -> list:
    """FieldInfo objects in Annotated carry their constraints in .metadata; the rest is kept as is."""
    flat = []
    for item in metadata:
        flat.extend(getattr(item, "metadata", None) or [item])
    return flat


def _range(metadata: list) -> tuple[float | None, float | None, bool, bool]:
    """(low, high, low excluded, high excluded) from annotated_types constraints."""
    low = high = None
    open_low = open_high = False
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = item.ge
        elif isinstance(item, annotated_types.Gt):
            low, open_low = item.gt, True
        elif isinstance(item, annotated_types.Le):
            high = item.le
        elif isinstance(item, annotated_types.Lt):
            high, open_high = item.lt, True
        elif isinstance(item, annotated_types.MaxLen):
            high = item.max_length
        elif isinstance(item, annotated_types.MinLen):
            low = item.min_length
    return low, high, open_low, open_high


def table_text(rows: list[Limit], markdown: bool = False) -> str:
    """The table for people: aligned columns, or a Markdown table."""
    if markdown:
        lines = ["| key | kind | bound |", "|---|---|---|"]
        lines += [f"| `{row.key}` | {row.kind} | {row.text()} |" for row in rows]
        return "\n".join(lines) + "\n"
    width = max(len(row.key) for row in rows)
    return "".join(f"{row.key.ljust(width)}  {row.kind:<11}  {row.text()}\n" for row in rows)
