"""Turn a judge model's raw text into validated scores, or one clear reason why not.

Small judge models wrap their JSON in markdown fences, talk before and after
it, use single quotes and leave trailing commas. `find_json_values` finds every
complete JSON-like object or list in the text (strict JSON first, then YAML's
flow syntax, which accepts single quotes, bare keys and trailing commas); the
mode parsers take the first one of the right shape and validate it.

Both modes ask for scores on a 0-10 scale (integers are what small models give
reliably) and return them divided by `SCORE_MAX`, so every score is in 0..1.
Anything else (a score outside 0..10, NaN, a missing, extra or repeated id,
text with no complete JSON) raises `JudgeOutputError`, whose message is fed
back to the model when it is asked again.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterator

import yaml

SCORE_MAX = 10.0

_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_OPENERS = {"{": "}", "[": "]"}
_ID_KEYS = ("id", "response_id", "response", "index")
_REASON_KEYS = ("reason", "explanation", "rationale")


class JudgeOutputError(ValueError):
    """The judge's answer cannot be used; the message says what was wrong."""


@dataclass(frozen=True)
class Verdict:
    """One judged response: a score in 0..1 and the judge's short reason."""

    score: float
    reason: str = ""


def find_json_values(text: str) -> Iterator[Any]:
    """Every complete object or list in `text`, fenced blocks first, in order of appearance."""
    sources = [match.group(1) for match in _FENCE.finditer(text)] + [_FENCE.sub("\n", text)]
    for source in sources:
        for start, character in enumerate(source):
            if character not in _OPENERS:
                continue
            span = _balanced_span(source, start)
            if span is None:
                continue
            value = _load_lenient(span)
            if isinstance(value, (dict, list)):
                yield value


def _balanced_span(text: str, start: int) -> str | None:
    """The bracketed text starting at `start` up to its matching closer, or None if it never closes."""
    stack: list[str] = []
    quote: str | None = None
    previous_significant = ""
    index = start
    while index < len(text):
        character = text[index]
        if quote:
            if character == "\\":
                index += 2
                continue
            if character == quote:
                quote = None
        elif character == '"' or (character == "'" and previous_significant in "{[,:"):
            # A single quote opens a string only where a key or value starts, so an
            # apostrophe in a bare word ("it's") does not swallow the rest of the text.
            quote = character
        elif character in _OPENERS:
            stack.append(_OPENERS[character])
        elif character in "}]":
            if not stack or character != stack.pop():
                return None
            if not stack:
                return text[start:index + 1]
        if not character.isspace():
            previous_significant = character
        index += 1
    return None


def _load_lenient(span: str) -> Any:
    try:
        return json.loads(span)
    except ValueError:
        pass
    try:
        return yaml.safe_load(span)
    except yaml.YAMLError:
        return None


def _lowercase_keys(mapping: dict) -> dict:
    return {str(key).strip().lower(): value for key, value in mapping.items()}


def _no_json_error(text: str) -> JudgeOutputError:
    if not text.strip():
        return JudgeOutputError("the answer was empty")
    if _looks_truncated(text):
        return JudgeOutputError("the answer has no complete JSON object (it looks cut off or malformed)")
    return JudgeOutputError("the answer contains no JSON object")


def validate_score(value: Any, where: str = "score") -> float:
    """A raw 0-10 score as a number in 0..1; JudgeOutputError if it is not a finite number in range."""
    if isinstance(value, bool) or value is None:
        raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value.strip().removesuffix("/10").strip())
        except ValueError:
            raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {value!r}") from None
    if not isinstance(value, (int, float)):
        raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {value!r}")
    if not math.isfinite(value):
        raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {value!r}")
    if not 0 <= value <= SCORE_MAX:
        raise JudgeOutputError(f"{where} {value:g} is outside 0 to 10")
    return float(value) / SCORE_MAX


def _reason(entry: dict) -> str:
    for key in _REASON_KEYS:
        if isinstance(entry.get(key), str):
            return entry[key].strip()
    return ""


def parse_pointwise(text: str) -> Verdict:
    """The verdict in a pointwise answer `{"score": 0-10, "reason": "..."}`.

    The first object with a valid score wins, so an echoed format template
    (`{"score": <0-10>}`) before the real answer does no harm.
    """
    return _first_valid(text, _pointwise_verdict, 'the JSON object has no "score" key')


def _pointwise_verdict(value: Any) -> Verdict | None:
    if not isinstance(value, dict):
        return None
    entry = _lowercase_keys(value)
    if "score" not in entry:
        return None
    return Verdict(validate_score(entry["score"]), _reason(entry))


def _first_valid(text: str, interpret, wrong_shape_message: str):
    """The first JSON value `interpret` accepts; else the first validation error, or why none fits."""
    found_any = False
    first_error: JudgeOutputError | None = None
    for value in find_json_values(text):
        found_any = True
        try:
            result = interpret(value)
        except JudgeOutputError as error:
            first_error = first_error or error
            continue
        if result is not None:
            return result
    if first_error is not None:
        raise first_error
    if found_any and not _looks_truncated(text):
        raise JudgeOutputError(wrong_shape_message)
    raise _no_json_error(text)


def _looks_truncated(text: str) -> bool:
    """True when the first bracket in the text (outside fences) is never closed."""
    unfenced = _FENCE.sub("\n", text)
    first = next((i for i, character in enumerate(unfenced) if character in _OPENERS), None)
    return first is not None and _balanced_span(unfenced, first) is None


def parse_group(text: str, expected_ids: list[str]) -> dict[str, Verdict]:
    """The verdict for each response id in a group answer.

    Accepted shapes: `{"scores": [{"id": "1", "score": 7, "explanation": "..."}, ...]}`,
    the bare list, or a mapping `{"1": {"score": 7, ...}, "2": 4}`. Exactly the
    ids in `expected_ids`, each once.
    """
    def interpret(value: Any) -> dict[str, Verdict] | None:
        entries = _group_entries(value)
        return None if entries is None else _validate_group(entries, expected_ids)

    return _first_valid(text, interpret, 'the JSON has no "scores" list of {"id", "score", "explanation"} entries')


def _normalise_id(raw: Any) -> str:
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    return str(raw).strip()


def _group_entries(value: Any) -> list[tuple[str, Any, str]] | None:
    """(id, raw score, reason) triples if `value` has a recognisable group shape, else None."""
    if isinstance(value, dict):
        lowered = _lowercase_keys(value)
        if isinstance(lowered.get("scores"), (list, dict)):
            return _group_entries(lowered["scores"])
        if value and all(_normalise_id(key).isdigit() for key in value):
            entries = []
            for key, item in value.items():
                item_fields = _lowercase_keys(item) if isinstance(item, dict) else {"score": item}
                entries.append((_normalise_id(key), item_fields.get("score"), _reason(item_fields)))
            return entries
        return None
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        entries = []
        for item in value:
            fields = _lowercase_keys(item)
            key = next((k for k in _ID_KEYS if k in fields), None)
            if key is None or "score" not in fields:
                return None
            entries.append((_normalise_id(fields[key]), fields["score"], _reason(fields)))
        return entries
    return None


def _validate_group(entries: list[tuple[str, Any, str]], expected_ids: list[str]) -> dict[str, Verdict]:
    seen: dict[str, Verdict] = {}
    duplicates: list[str] = []
    for response_id, raw_score, reason in entries:
        if response_id in seen:
            duplicates.append(response_id)
            continue
        seen[response_id] = Verdict(validate_score(raw_score, where=f"the score of id {response_id}"), reason)
    problems = []
    if duplicates:
        problems.append(f"ids scored more than once: {', '.join(sorted(set(duplicates)))}")
    missing = [i for i in expected_ids if i not in seen]
    if missing:
        problems.append(f"missing ids: {', '.join(missing)}")
    extra = [i for i in seen if i not in expected_ids]
    if extra:
        problems.append(f"unknown ids: {', '.join(extra)} (the ids are {', '.join(expected_ids)})")
    if problems:
        raise JudgeOutputError("; ".join(problems))
    return {response_id: seen[response_id] for response_id in expected_ids}
