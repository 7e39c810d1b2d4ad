"""judge.jsonl stays bounded: it rotates to judge.jsonl.1, .2, ... and drops the oldest."""

from __future__ import annotations

import json

import pytest

from appliance.judge.log import JudgeLog


def write_records(log: JudgeLog, count: int) -> None:
    for index in range(count):
        log.write({"index": index, "raw_output": "x" * 80})


def test_rotates_and_keeps_only_the_configured_backups(tmp_path):
    path = tmp_path / "judge.jsonl"
    log = JudgeLog(path, max_bytes=1000, backups=2)
    write_records(log, 100)  # about 110 bytes a line: ~11 files' worth
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["judge.jsonl", "judge.jsonl.1", "judge.jsonl.2"]
    assert all(p.stat().st_size <= 1000 for p in tmp_path.iterdir())
    # Newest records are in judge.jsonl, every line whole JSON, and the three files are consecutive.
    indices = [
        json.loads(line)["index"]
        for name in ("judge.jsonl.2", "judge.jsonl.1", "judge.jsonl")
        for line in (tmp_path / name).read_text().splitlines()
    ]
    assert indices[-1] == 99 and indices == list(range(indices[0], 100))


def test_zero_backups_still_bounds_the_file(tmp_path):
    path = tmp_path / "judge.jsonl"
    log = JudgeLog(path, max_bytes=500, backups=0)
    write_records(log, 50)
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["judge.jsonl"]
    assert path.stat().st_size <= 500
    assert json.loads(path.read_text().splitlines()[-1])["index"] == 49


def test_creates_the_job_folder(tmp_path):
    path = tmp_path / "jobs" / "3" / "judge.jsonl"
    log = JudgeLog(path)
    log.write({"step": 1})
    log.close()
    assert json.loads(path.read_text()) == {"step": 1}


@pytest.mark.parametrize("max_bytes, backups, message", [(0, 1, "max_bytes"), (10, -1, "backups")])
def test_bad_sizes_are_refused(tmp_path, max_bytes, backups, message):
    with pytest.raises(ValueError, match=message):
        JudgeLog(tmp_path / "judge.jsonl", max_bytes=max_bytes, backups=backups)
