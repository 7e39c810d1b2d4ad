"""`appliance train --resume` over a dataset that changed since the checkpoint: one line, exit 2, nothing trained."""

from __future__ import annotations

import json

import pytest
import yaml
from tiny_model import tiny_job

from appliance.cli.main import main

pytestmark = pytest.mark.model


def _rows(count: int) -> str:
    return "".join(json.dumps({"question": f"What is {n} * 3?", "answer": str(3 * n)}) + "\n" for n in range(count))


def test_a_resume_over_other_data_is_refused_naming_the_checkpoint_and_restart(
    tiny_model_dir, tmp_path, fresh_data_dir, capsys
):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(_rows(10))
    job_file = tiny_job(tiny_model_dir, tmp_path, grpo={"steps": 1}, checkpoint={"every": 1})
    job = yaml.safe_load(job_file.read_text())
    job["task"] = {"dataset": str(dataset), "held_out": 2}
    job_file.write_text(yaml.safe_dump(job, sort_keys=False))
    assert main(["train", str(job_file), "--data-dir", str(fresh_data_dir)]) == 0
    checkpoint = fresh_data_dir / "jobs" / "tiny" / "checkpoints" / "step-000001"
    assert checkpoint.is_dir()
    capsys.readouterr()

    dataset.write_text(_rows(12))  # the job file is the same; the data under it is not
    assert main(["train", str(job_file), "--data-dir", str(fresh_data_dir), "--resume"]) == 2
    err = capsys.readouterr().err  # in-process, the library's loading bars reach it too (log.txt in a shell)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: cannot resume from {checkpoint}: ")
    assert "num_problems=8, but this run has num_problems=10" in lines[0] and "--restart" in lines[0]
    log = (fresh_data_dir / "jobs" / "tiny" / "log.txt").read_text()
    assert "is damaged" not in log and "Traceback" not in log  # not mistaken for a torn checkpoint
