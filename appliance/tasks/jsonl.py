"""User datasets as JSON Lines: one problem per line, every line checked before training starts.

A row is either

    {"question": "What is 6 * 7?", "answer": "42"}
    {"messages": [{"role": "user", "content": "..."}], "answer": "42"}

with optional "id" (string or integer) and "metadata" (object). "answer" may
be a string or a number and may be left out (judge-only tasks). `messages`
must end with a user turn: that is the question the student answers. Blank
lines are skipped. Every bad line is reported with its number (the first ten).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

from appliance.errors import ApplianceError
from appliance.suggest import did_you_mean
from appliance.tasks.task import Problem, TaskError

ROW_KEYS = ("id", "question", "messages", "answer", "metadata")
ROLES = ("system", "user", "assistant")
MAX_REPORTED_ERRORS = 10  # a file of many bad rows gets a readable error: the first few, and the count


class RowError(ApplianceError):
    """What is wrong with one row; the caller adds the file and line."""


def read_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; bad JSON yields (line, RowError)."""
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as error:
                yield line_number, RowError(f"not valid JSON ({error.msg} at column {error.colno})")


def parse_rows(path: Path, parse_row: Callable[[Any, int, Path], Problem]) -> list[Problem]:
    """Parse every line of `path` with `parse_row`; raise one TaskError listing the first bad lines."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task.dataset: {path} does not exist")
    problems: list[Problem] = []
    errors: list[str] = []
    error_count = 0
    try:
        for line_number, row in read_json_lines(path):
            try:
                if isinstance(row, RowError):
                    raise row
                problems.append(parse_row(row, line_number, path))
            except RowError as error:
                error_count += 1
                if len(errors) < MAX_REPORTED_ERRORS:
                    errors.append(f"{path}:{line_number}: {error}")
    except UnicodeDecodeError as error:
        raise TaskError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    if errors:
        more = f"\n... and {error_count - len(errors)} more bad lines" if error_count > len(errors) else ""
        raise TaskError(f"{error_count} bad line(s) in dataset {path}:\n" + "\n".join(errors) + more)
    if not problems:
        raise TaskError(f"task.dataset: {path} holds no problems (one JSON object per line)")
    return problems


def _check_keys(row: dict) -> None:
    unknown = [key for key in row if key not in ROW_KEYS]
    if unknown:
        key = unknown[0]
        hint = did_you_mean(key, ROW_KEYS) or f"; allowed keys: {', '.join(ROW_KEYS)}"
        raise RowError(f"unknown key {key!r}{hint}")


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RowError('\'messages\' must be a non-empty list of {"role", "content"} objects')
    messages = []
    for position, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise RowError(f"messages[{position}] must be an object with exactly 'role' and 'content'")
        if message["role"] not in ROLES:
            raise RowError(f"messages[{position}].role is {message['role']!r}; use one of {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise RowError(f"messages[{position}].content must be a string")
        messages.append({"role": message["role"], "content": message["content"]})
    if messages[-1]["role"] != "user":
        raise RowError("the last of 'messages' must be a user turn (the question to answer)")
    return messages


def _answer(row: dict) -> str | None:
    if "answer" not in row or row["answer"] is None:
        return None
    answer = row["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise RowError(f"'answer' must be a string or a number, not {type(answer).__name__}")
    return answer if isinstance(answer, str) else str(answer)


def parse_problem_row(row: Any, line_number: int, path: Path) -> Problem:
    """One user row -> Problem; raises RowError saying what is wrong."""
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    _check_keys(row)
    has_question, has_messages = "question" in row, "messages" in row
    if has_question == has_messages:
        raise RowError("give exactly one of 'question' (a string) or 'messages' (a list of chat turns)")
    metadata = row.get("metadata", {})
    if not isinstance(metadata, dict):
        raise RowError("'metadata' must be a JSON object")
    metadata = dict(metadata)
    if has_question:
        question = row["question"]
        if not isinstance(question, str) or not question.strip():
            raise RowError("'question' must be a non-empty string")
    else:
        messages = _messages(row["messages"])
        metadata["messages"] = messages
        question = messages[-1]["content"]
    row_id = row.get("id", f"{path.stem}-{line_number}")
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        raise RowError("'id' must be a string or an integer")
    metadata.setdefault("line", line_number)
    return Problem(id=str(row_id), question=question, answer=_answer(row), metadata=metadata)


def load_jsonl_problems(path: Path) -> list[Problem]:
    """Every problem in a user JSONL file, in file order (also used by `appliance eval --data`)."""
    return parse_rows(path, parse_problem_row)
