"""User JSONL datasets: accepted rows, and every bad line reported by number before training."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.config.schema import TaskSpec
from appliance.tasks import TaskError, load_jsonl_problems, load_task
from appliance.tasks import jsonl
from appliance.tasks.gsm8k import load_gsm8k
from appliance.tasks.jsonl import read_json_lines


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_question_and_messages_rows(tmp_path):
    path = write_lines(
        tmp_path / "data.jsonl",
        [
            {"question": "What is 2 + 2?", "answer": "4"},
            "",
            {"id": "q-7", "question": "What is 3 + 4?", "answer": 7, "metadata": {"topic": "sums"}},
            {"messages": [{"role": "user", "content": "Name a colour."}]},
        ],
    )
    problems = load_jsonl_problems(path)
    assert [(p.id, p.question, p.answer) for p in problems] == [
        ("data-1", "What is 2 + 2?", "4"),
        ("q-7", "What is 3 + 4?", "7"),
        ("data-4", "Name a colour.", None),
    ]
    assert problems[1].metadata == {"topic": "sums", "line": 3}


def test_messages_rows_keep_their_turns_and_get_the_system_prompt(tmp_path):
    own = [
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": "And 4 * 5?"},
    ]
    with_system = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi?"}]
    rows = [{"messages": own, "answer": "20"}, {"messages": with_system}, {"question": "q3"}, {"question": "q4"}]
    write_lines(tmp_path / "chat.jsonl", rows)
    task = load_task(TaskSpec(dataset="chat.jsonl", system_prompt="Answer briefly.", held_out=0), tmp_path)
    by_question = {p.question: p for p in task.train}
    assert task.messages(by_question["And 4 * 5?"]) == [{"role": "system", "content": "Answer briefly."}, *own]
    assert task.messages(by_question["Hi?"]) == with_system
    assert by_question["And 4 * 5?"].answer == "20"


def test_bad_lines_are_all_reported_with_their_numbers(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl",
        [
            {"question": "ok", "answer": "1"},
            '{"question": "unterminated',
            {"answer": "3"},
            {"question": "q", "anwser": "4"},
            {"question": 5, "answer": "5"},
            {"question": "q", "answer": True},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            {"messages": [{"role": "robot", "content": "q"}]},
            ["not", "an", "object"],
        ],
    )
    with pytest.raises(TaskError) as raised:
        load_jsonl_problems(path)
    message = str(raised.value)
    assert message.startswith(f"8 bad line(s) in dataset {path}:")
    for expected in [
        f"{path}:2: not valid JSON",
        f"{path}:3: give exactly one of 'question'",
        f"{path}:4: unknown key 'anwser'; did you mean 'answer'?",
        f"{path}:5: 'question' must be a non-empty string",
        f"{path}:6: 'answer' must be a string or a number, not bool",
        f"{path}:7: the last of 'messages' must be a user turn",
        f"{path}:8: messages[0].role is 'robot'",
        f"{path}:9: expected a JSON object, got list",
    ]:
        assert expected in message
    assert f"{path}:1:" not in message


def test_only_the_first_ten_bad_lines_are_listed(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", ["{oops"] * 13)
    with pytest.raises(TaskError) as raised:
        load_jsonl_problems(path)
    message = str(raised.value)
    assert f"{path}:10: not valid JSON" in message
    assert f"{path}:11:" not in message
    assert message.endswith("... and 3 more bad lines")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TaskError, match=r"task\.dataset: .*missing\.jsonl does not exist"):
        load_task(TaskSpec(dataset="missing.jsonl"), tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TaskError, match="holds no problems"):
        load_jsonl_problems(tmp_path / "empty.jsonl")


def test_dataset_path_is_relative_to_the_job_folder_and_split(tmp_path):
    (tmp_path / "jobs").mkdir()
    write_lines(tmp_path / "jobs" / "sums.jsonl", [{"question": f"{n} + 1?", "answer": str(n + 1)} for n in range(10)])
    task = load_task(TaskSpec(dataset="sums.jsonl", held_out=3, seed=1), tmp_path / "jobs")
    assert task.name == "sums"
    assert (len(task.train), len(task.held_out)) == (7, 3)
    assert {p.id for p in task.train}.isdisjoint({p.id for p in task.held_out})
    with pytest.raises(TaskError, match=r"task\.held_out \(10\) must be smaller than the 10 problems"):
        load_task(TaskSpec(dataset="sums.jsonl", held_out=10), tmp_path / "jobs")


@pytest.mark.parametrize("kind", ["fifo", "char device", "directory", "socket"])
def test_a_fifo_or_device_in_place_of_the_checked_dataset_is_refused_not_read(tmp_path, kind):
    """What the reader opens is checked on its descriptor: a file swapped after the check for a FIFO (a reader
    waiting for ever) or a device (/dev/zero, a line with no end) never hangs or floods the job."""
    path = tmp_path / "rows.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "char device":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(list(read_json_lines(path)))
        except (TaskError, OSError) as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive() and kind == "fifo":
        with open(path, "wb"):
            pass  # let the blocked reader go before failing
    assert outcome and isinstance(outcome[0], (TaskError, OSError)), f"the {kind} was read: {outcome}"
    assert kind == "socket" or "not a regular file" in str(outcome[0])


def nested_dataset(root: Path, depth: int) -> Path:
    """root/d0/.../d{depth-1}/rows.jsonl holding one good row."""
    folder = root.joinpath(*(f"d{level}" for level in range(depth)))
    folder.mkdir(parents=True)
    return write_lines(folder / "rows.jsonl", [{"question": "What is 2 + 2?", "answer": "4"}])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(1, 4), data=st.data())
def test_a_link_put_in_an_admitted_path_is_never_followed(tmp_path_factory, monkeypatch, depth, data):
    """The daemon admits a dataset as its resolved path; a member who can write a folder on that path swaps the
    folder (or the file) for a link elsewhere before the job runs. The worker opens it through no link at all:
    any component replaced is refused by name, whatever its depth; the path as admitted still reads."""
    root = tmp_path_factory.mktemp("roots")
    admitted = nested_dataset(root / "datasets", depth)
    elsewhere = nested_dataset(root / "secret", depth)  # the same names outside the root, readable by the daemon
    monkeypatch.setattr(jsonl, "_admitted_paths_only", True)
    assert [problem.answer for problem in load_jsonl_problems(admitted)] == ["4"]

    level = data.draw(st.integers(0, depth), label="the component swapped for a link")
    swapped = admitted.parents[depth - level - 1] if level < depth else admitted
    target = elsewhere.parents[depth - level - 1] if level < depth else elsewhere
    shutil.rmtree(swapped) if swapped.is_dir() else swapped.unlink()
    swapped.symlink_to(target)
    with pytest.raises(TaskError, match="now goes through a link"):
        load_jsonl_problems(admitted)


def test_the_cli_and_the_shipped_gsm8k_still_read_through_links(tmp_path, monkeypatch):
    """Outside the daemon's workers a path is the user's own to name (a linked home folder is fine), and the
    shipped GSM8K copy is read where the package lies, links in the install or not."""
    real = nested_dataset(tmp_path / "real", 1)
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    assert len(load_jsonl_problems(tmp_path / "linked" / "d0" / "rows.jsonl")) == 1
    monkeypatch.setattr(jsonl, "_admitted_paths_only", True)
    assert len(load_jsonl_problems(real)) == 1
    assert len(load_gsm8k()) == 7473
