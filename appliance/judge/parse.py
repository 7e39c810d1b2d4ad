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
import reprlib
from dataclasses import dataclass
from typing import Any, Iterator

import yaml

from appliance.errors import ApplianceError

SCORE_MAX = 10.0

_OPENERS = {"{": "}", "[": "]"}
_ID_KEYS = ("id", "response_id", "response", "index")
_REASON_KEYS = ("reason", "explanation", "rationale")
# Longer spans are not worth YAML's lenient (and slow, pure-Python) reading: JSON only.
YAML_MAX_CHARS = 4096
# Deeper nesting is not a judge answer; such spans are skipped before any loader recurses into them.
MAX_DEPTH = 64


class JudgeOutputError(ApplianceError):
    """The judge's answer cannot be used; the message says what was wrong."""


@dataclass(frozen=True)
class Verdict:
    """One judged response: a score in 0..1 and the judge's short reason."""

    score: float
    reason: str = ""


def _sources(text: str) -> list[str]:
    """Fenced blocks first (their language tag dropped), then the text outside fences: one linear split."""
    parts = text.split("```")
    fenced = [
        part.split("\n", 1)[1] if "\n" in part and part.split("\n", 1)[0].strip().isidentifier() else part
        for part in parts[1:-1:2]
    ]
    # An even count of parts means a fence was opened and never closed: its text counts as outside, fence kept.
    outside = "\n".join(parts[0::2]) if len(parts) % 2 == 1 else "\n".join(parts[0:-1:2] + ["```" + parts[-1]])
    return fenced + [outside]


def find_json_values(text: str) -> Iterator[Any]:
    """Every complete object or list in `text`, fenced blocks first, in order of appearance.

    The outermost complete spans are loaded once each; the objects and lists
    nested in what they hold follow their parent, so the cost stays linear.
    """
    for source in _sources(text):
        spans, _ = _scan(source)
        for start, end in spans:
            value = _load_lenient(source[start:end])
            if isinstance(value, (dict, list)):
                yield from _walk(value)


def _walk(value: Any) -> Iterator[Any]:
    """`value` and every object or list inside it, parents first (iterative: no recursion limit)."""
    pending = [value]
    while pending:
        current = pending.pop()
        yield current
        children = current.values() if isinstance(current, dict) else current
        pending.extend(reversed([child for child in children if isinstance(child, (dict, list))]))


def _scan(text: str) -> tuple[list[tuple[int, int]], bool]:
    """One pass: the maximal complete bracket spans (start, end) and whether a bracket was left open.

    A span inside a bracket that never closes still counts (`junk { ... {"score": 5}`).
    A mismatched closer abandons the brackets open so far. Every character is
    looked at once and every span is recorded once and dropped at most once, so
    the cost is linear in the text whatever its shape. Spans nested deeper than
    MAX_DEPTH are not recorded (no loader recurses into them).
    """
    spans: list[tuple[int, int]] = []
    stack: list[tuple[str, int]] = []  # (expected closer, start)
    quote: str | None = None
    previous_significant = ""
    index = 0
    length = len(text)
    while index < length:
        character = text[index]
        if stack and quote:
            if character == "\\":
                index += 2
                continue
            if character == quote:
                quote = None
        elif stack and (character == '"' or (character == "'" and previous_significant in "{[,:")):
            # A single quote opens a string only where a key or value starts, so an
            # apostrophe in a bare word ("it's") does not swallow the rest of the text.
            quote = character
        elif character in _OPENERS:
            stack.append((_OPENERS[character], index))
        elif character in "}]" and stack:
            closer, start = stack.pop()
            if character != closer:  # "{ ]": nothing open so far can close well
                stack.clear()
            else:
                while spans and spans[-1][0] > start:  # now inside this span: not maximal
                    spans.pop()
                if len(stack) < MAX_DEPTH:
                    spans.append((start, index + 1))
        if not character.isspace():
            previous_significant = character
        index += 1
    return spans, bool(stack)


def _load_lenient(span: str) -> Any:
    """JSON, else YAML flow syntax for short spans; None when neither reads it (never raises)."""
    try:
        return json.loads(span)
    except (ValueError, RecursionError):
        pass
    if len(span) > YAML_MAX_CHARS:
        return None
    try:
        if _has_anchors(span):  # a judge's answer has no use for them; expanding them is an alias bomb
            return None
        return yaml.load(span, Loader=_YAML_LOADER)
    except Exception:  # noqa: BLE001 - YAML's constructors raise more than YAMLError (dates, huge ints)
        return None


def _has_anchors(span: str) -> bool:
    """Whether the YAML text defines an anchor or uses an alias, read from its events before any node is built."""
    return any(
        isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None
        for event in yaml.parse(span, Loader=_YAML_LOADER)
    )


# Safe loading only (no Python objects), in C where libyaml is present.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def close_group_answer(text: str, count: int) -> str:
    """A group answer stopped where it began naming id count+1: cut that entry off and close the JSON."""
    extra = text.find(f'"id": "{count + 1}"')
    if extra < 0:
        return text
    cut = text.rfind("}", 0, extra)
    return text if cut < 0 else text[: cut + 1] + "]}"


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
        raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {_shown(value)}")
    if isinstance(value, str):
        try:
            value = float(value.strip().removesuffix("/10").strip())  # small judges write "7/10"
        except ValueError:
            raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {_shown(value)}") from None
    if not isinstance(value, (int, float)):
        raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {_shown(value)}")
    if not math.isfinite(value):
        raise JudgeOutputError(f"{where} must be a number from 0 to 10, got {_shown(value)}")
    if not 0 <= value <= SCORE_MAX:
        raise JudgeOutputError(f"{where} {value:g} is outside 0 to 10")
    return float(value) / SCORE_MAX


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 60
_SHORT_REPR.maxlist = _SHORT_REPR.maxdict = 6


def _shown(value: Any, limit: int = 80) -> str:
    """The value for an error message, cut: the message goes into the retry prompt and judge.jsonl."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(entry: dict) -> str:
    for key in _REASON_KEYS:
        if isinstance(entry.get(key), str):
            return entry[key].strip()
    return ""


def _guarded(parse):
    """No exception but JudgeOutputError leaves a parser: a bad answer must never stop training."""

    def guarded(text: str, *args):
        try:
            return parse(text, *args)
        except JudgeOutputError:
            raise
        except Exception as error:  # noqa: BLE001 - the point of the guard
            raise JudgeOutputError(f"the answer could not be read ({type(error).__name__})") from None

    guarded.__doc__, guarded.__name__ = parse.__doc__, parse.__name__
    return guarded


@_guarded
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
    """True when a bracket in the text (outside fences) is left open."""
    return _scan(_sources(text)[-1])[1]


@_guarded
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
