"""builtin:gsm8k: the GSM8K train split shipped inside the package (data/gsm8k, MIT licensed).

Every row's worked solution ends in "#### N"; N (thousands commas removed)
is the reference answer and the whole solution stays in metadata["solution"].
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from appliance.tasks.task import Problem
from appliance.tasks.jsonl import RowError, parse_rows

GSM8K_TRAIN_SIZE = 7473  # rows of the official train split, all shipped: a test checks none is lost
_FINAL_ANSWER = re.compile(r"-?\d+(?:\.\d+)?")  # GSM8K's answers are integers, a few signed or decimal


def gsm8k_path() -> Path:
    """The shipped train.jsonl, wherever the package is installed."""
    return Path(str(resources.files("appliance.tasks") / "data" / "gsm8k" / "train.jsonl"))


def final_answer(solution: str) -> str:
    """The number after the last "####" of a GSM8K solution, without thousands commas."""
    if "####" not in solution:
        raise RowError("the answer has no '#### N' final line")
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not _FINAL_ANSWER.fullmatch(final):
        raise RowError(f"the final answer {final!r} after '####' is not a number")
    return final


def _parse_gsm8k_row(row: Any, line_number: int, path: Path) -> Problem:
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
        raise RowError("expected an object with string 'question' and 'answer'")
    return Problem(
        id=f"gsm8k-train-{line_number}",
        question=row["question"],
        answer=final_answer(row["answer"]),
        metadata={"solution": row["answer"], "line": line_number},
    )


def load_gsm8k(path: Path | None = None) -> list[Problem]:
    """All GSM8K train problems in file order (7473 for the shipped copy)."""
    return parse_rows(path or gsm8k_path(), _parse_gsm8k_row, shipped=path is None)
