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

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from appliance.config.limits import MAX_DATASET_ROW_BYTES, MAX_DATASET_ROWS
from appliance.text_rules import text_problem
from appliance.errors import ApplianceError
from appliance.suggest import did_you_mean
from appliance.tasks.task import Problem, TaskError

ROW_KEYS = ("id", "question", "messages", "answer", "metadata")
ROLES = ("system", "user", "assistant")
MAX_REPORTED_ERRORS = 10  # a file of many bad rows gets a readable error: the first few, and the count


class RowError(ApplianceError):
    """What is wrong with one row; the caller adds the file and line."""


def read_json_lines(path: Path, shipped: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; bad JSON, or a line over MAX_DATASET_ROW_BYTES,
    yields (line, RowError). A line is never read past that cap."""
    with _open_regular(path, follow_links=shipped or not _admitted_paths_only) as handle:
        line_number = 0
        while True:
            line = handle.readline(MAX_DATASET_ROW_BYTES + 1)
            if not line:
                return
            line_number += 1
            if len(line) > MAX_DATASET_ROW_BYTES:
                while line and not line.endswith(b"\n"):  # skip the rest of the long line, a chunk at a time
                    line = handle.readline(MAX_DATASET_ROW_BYTES)
                yield line_number, RowError(f"the line is over the limit of {MAX_DATASET_ROW_BYTES} bytes")
                continue
            text = line.decode("utf-8")
            if not text.strip():
                continue
            try:
                yield line_number, json.loads(text)
            except json.JSONDecodeError as error:
                yield line_number, RowError(f"not valid JSON ({error.msg} at column {error.colno})")


_admitted_paths_only = False  # set in the daemon's workers: see read_admitted_paths_only


def read_admitted_paths_only() -> None:
    """From here on this process opens a dataset through no link at all. The daemon admits a dataset as its
    resolved path, so a link in that path now was put there after the check, by someone who can write a folder
    on it: following it would read a file outside the dataset roots."""
    global _admitted_paths_only
    _admitted_paths_only = True


def _open_without_links(path: Path, flags: int) -> int:
    """`path` (absolute) opened one component at a time, refusing a link at any of them (no openat2 in Python)."""
    parts = Path(path).parts
    if not Path(path).is_absolute() or len(parts) < 2:
        raise TaskError(f"task.dataset: {path} is not the absolute path the daemon admitted; submit the job again")
    folder = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[1:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=folder)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise TaskError(
                f"task.dataset: {path} now goes through a link, put there after the daemon admitted the job; "
                "the daemon does not follow it. Put the file back, or submit the job again"
            ) from error
        raise
    finally:
        os.close(folder)


def _open_regular(path: Path, follow_links: bool) -> BinaryIO:
    """`path` opened for reading when it is a regular file; else a TaskError. Opened without blocking and checked
    on the descriptor: a FIFO or device put in place of the checked file never hangs or floods the reader."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    descriptor = os.open(path, flags) if follow_links else _open_without_links(path, flags)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise TaskError(f"task.dataset: {path} is not a regular file; name a .jsonl file")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def checked_rows(
    path: Path, parse_row: Callable[[Any, int, Path], Problem], shipped: bool = False
) -> Iterator[Problem]:
    """Each problem of `path` as it is read; at the end, one TaskError listing the first bad lines (if any)."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task.dataset: {path} does not exist")
    errors: list[str] = []
    error_count = rows = 0
    try:
        for line_number, row in read_json_lines(path, shipped):
            try:
                if isinstance(row, RowError):
                    raise row
                problem = parse_row(row, line_number, path)
                rows += 1
                if rows > MAX_DATASET_ROWS:
                    raise TaskError(f"task.dataset: {path} holds more than {MAX_DATASET_ROWS} problems; split it")
                yield problem
            except RowError as error:
                error_count += 1
                if len(errors) < MAX_REPORTED_ERRORS:
                    errors.append(f"{path}:{line_number}: {error}")
    except UnicodeDecodeError as error:
        raise TaskError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    if errors:
        more = f"\n... and {error_count - len(errors)} more bad lines" if error_count > len(errors) else ""
        raise TaskError(f"{error_count} bad line(s) in dataset {path}:\n" + "\n".join(errors) + more)
    if not rows:
        raise TaskError(f"task.dataset: {path} holds no problems (one JSON object per line)")


def _clean_tree(value: Any, where: str) -> None:
    """Every key and string inside a JSON value under the string rule."""
    if isinstance(value, str):
        _clean(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _clean(key, f"{where} key")
            _clean_tree(item, f"{where}.{key[:40]}")
    elif isinstance(value, list):
        for item in value:
            _clean_tree(item, where)


def parse_rows(path: Path, parse_row: Callable[[Any, int, Path], Problem], shipped: bool = False) -> list[Problem]:
    """Parse every line of `path` with `parse_row`; raise one TaskError listing the first bad lines. `shipped`: a
    file of the installed package, read where it lies (no caller names it)."""
    return list(checked_rows(path, parse_row, shipped))


def count_problems(path: Path) -> int:
    """How many problems a user JSONL file holds, every row checked and none kept (admission counts)."""
    return sum(1 for _ in checked_rows(path, parse_problem_row))


def _clean(value: str, where: str) -> str:
    """A row's text under the string rule (appliance/text_rules.py): it reaches prompts, logs and terminals."""
    problem = text_problem(value, multiline=True)
    if problem:
        raise RowError(f"{where} {problem}")
    return value


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
        _clean(message["content"], f"messages[{position}].content")
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
    return _clean(answer, "'answer'") if isinstance(answer, str) else str(answer)


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
    _clean_tree(metadata, "'metadata'")
    metadata = dict(metadata)
    if has_question:
        question = row["question"]
        if not isinstance(question, str) or not question.strip():
            raise RowError("'question' must be a non-empty string")
        _clean(question, "'question'")
    else:
        messages = _messages(row["messages"])
        metadata["messages"] = messages
        question = messages[-1]["content"]
    row_id = row.get("id", f"{path.stem}-{line_number}")
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        raise RowError("'id' must be a string or an integer")
    if isinstance(row_id, str):
        _clean(row_id, "'id'")
    metadata.setdefault("line", line_number)
    return Problem(id=str(row_id), question=question, answer=_answer(row), metadata=metadata)


def load_jsonl_problems(path: Path) -> list[Problem]:
    """Every problem in a user JSONL file, in file order (also used by `appliance eval --data`)."""
    return parse_rows(path, parse_problem_row)
