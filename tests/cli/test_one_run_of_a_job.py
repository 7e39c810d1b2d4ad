"""One run of a job at a time in a data dir: a second `appliance train` of a job still running (a resume or a
restart of a 2-rank job whose ranks are mid-run) is refused in one line and leaves the running one alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from tiny_model import tiny_job

from appliance.cli.main import main

pytestmark = pytest.mark.model


def test_a_job_still_running_is_not_resumed_or_restarted_by_a_second_train(
    tiny_model_dir, tmp_path, fresh_data_dir, capsys
):
    job_file = tiny_job(
        tiny_model_dir, tmp_path, grpo={"steps": 200, "prompts_per_step": 2}, checkpoint={"every": 1},
        resources={"gpus": 2},
    )  # fmt: skip
    job_dir = fresh_data_dir / "jobs" / "tiny"
    first = subprocess.Popen(
        [sys.executable, "-m", "appliance.cli.main", "train", str(job_file), "--data-dir", str(fresh_data_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 240
        while not (job_dir / "checkpoints" / "step-000001").is_dir():
            assert first.poll() is None and time.time() < deadline, "the first run did not reach its first checkpoint"
            time.sleep(0.2)
        for again in ("--resume", "--restart"):
            capsys.readouterr()
            assert main(["train", str(job_file), "--data-dir", str(fresh_data_dir), again]) == 2, again
            lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
            assert len(lines) == 1 and "already running" in lines[0], lines
        assert first.poll() is None and job_dir.is_dir()  # untouched: not archived, still training
        assert [path.name for path in fresh_data_dir.joinpath("jobs").iterdir() if not path.name.startswith(".")] == [
            "tiny"
        ]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the launcher and its forked ranks: one process group
        first.wait(timeout=30)


def test_nnodes_1_runs_the_job_on_this_box(tiny_model_dir, tmp_path, fresh_data_dir):
    """--nnodes 1 (a one-box job) once made a launcher whose one rank, forked with the same flags, launched again and
    was refused by the job folder its launcher had just made."""
    job_file = tiny_job(tiny_model_dir, tmp_path, grpo={"steps": 1}, checkpoint={"every": 1})
    assert main(["train", str(job_file), "--data-dir", str(fresh_data_dir), "--nnodes", "1"]) == 0
    assert (fresh_data_dir / "jobs" / "tiny" / "checkpoints" / "step-000001").is_dir()
