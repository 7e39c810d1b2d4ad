"""YAML job file -> JobSpec, or every error at once as `FILE:LINE:KEY: message`.

The YAML is composed into nodes first so that each key path knows its line;
pydantic then validates the plain data and its errors are mapped back to
those lines. Unknown keys get a did-you-mean suggestion.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from appliance.config.schema import JobSpec


@dataclass(frozen=True)
class ConfigError:
    file: str
    key: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}:{self.key or '(top)'}: {self.message}"


class JobFileError(Exception):
    """One or more problems in a job file; str() lists them one per line."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def _line_index(node: yaml.Node, path: tuple = (), index: dict | None = None) -> dict[tuple, int]:
    """Map every key path (tuple of keys / list indices) to its 1-based line."""
    index = {} if index is None else index
    index.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = path + (key_node.value,)
            index[child] = key_node.start_mark.line + 1
            _line_index(value_node, child, index)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            child = path + (position,)
            index[child] = item.start_mark.line + 1
            _line_index(item, child, index)
    return index


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The pydantic model class that holds the keys at `path`, if any."""
    model: Any = JobSpec
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        model = _unwrap_model(field.annotation)
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in getattr(annotation, "__args__", ()) or ():
        found = _unwrap_model(argument)
        if found is not None:
            return found
    return None


def _dotted(path: tuple) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _nearest_line(lines: dict[tuple, int], path: tuple) -> int | None:
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())


def _describe(error: dict, path: tuple) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(path[:-1])
        known = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(path[-1]), known, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else (f"; known keys: {', '.join(known)}" if known else "")
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if kind not in ("value_error", "assertion_error") and "input" in error and not isinstance(error["input"], dict):
        message += f" (got {error['input']!r})"
    return message


def parse_job_text(text: str, file: str = "<job>") -> JobSpec:
    """Validate YAML text; raise JobFileError with every problem found."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        column = f", column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobFileError([ConfigError(file, "", f"YAML syntax error{column}: {problem}", line)]) from None
    if not isinstance(data, dict):
        raise JobFileError([ConfigError(file, "", "a job file must be a YAML mapping of sections (name, student, rewards, ...)", 1)])
    lines = _line_index(root) if root is not None else {}
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = []
        for error in exc.errors():
            path = tuple(part for part in error["loc"] if not (isinstance(part, str) and part.startswith("function-")))
            # Drop pydantic's union branch names (e.g. 'JudgeSpec') that are not YAML keys.
            path = tuple(p for p in path if isinstance(p, int) or p in _keys_in(lines) or p == path[-1])
            errors.append(ConfigError(file, _dotted(path), _describe(error, path), _nearest_line(lines, path)))
        raise JobFileError(errors) from None


def _keys_in(lines: dict[tuple, int]) -> set:
    return {part for path in lines for part in path if isinstance(part, str)}


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file; raise JobFileError (or a one-line one for I/O)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFileError([ConfigError(str(path), "", f"cannot read the job file: {exc.strerror}")]) from None
    return parse_job_text(text, str(path))
