"""A bad command-line option ends the command with one line naming the option, and UsageError's exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.cli.main import EXIT_BAD_INPUT, main
from appliance.errors import ApplianceError, UsageError

QUESTION_JOB = """\
name: questions
student: {model: smollm2-135m-instruct}
task: {dataset: builtin:multiply, held_out: 4}
rewards: [{name: correctness}]
"""
GPU_EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "gsm8k-qwen7b-gpu.yaml")


def test_a_usage_error_is_input_to_correct():
    assert issubclass(UsageError, ApplianceError) and not issubclass(UsageError, ValueError)
    assert UsageError.exit_code == EXIT_BAD_INPUT and UsageError.http_status == 400


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--control-addr", "9470"], "error: --control-addr '9470' is not HOST:PORT with a port 1-65535"),
        (["serve", "--control-addr", "[::1]:0"], "error: --control-addr '[::1]:0' is not HOST:PORT"),
        (["serve", "--max-upload", "lots"], "error: --max-upload: 'lots' is not a size: write e.g. 70GiB"),
        (["serve", "--metrics-addr", "127.0.0.1:http"], "error: --metrics-addr '127.0.0.1:http' is not HOST:PORT"),
        (["train", "no-such-job.yaml", "--metrics-addr", "9464"], "error: --metrics-addr '9464' is not HOST:PORT"),
        (["judge", "eval", "shipped", "--mode", "pairwise"], "error: --mode: pairwise is not one of pointwise, group"),
        (["judge", "eval", "shipped", "--scoring", ","], "error: --scoring: (empty) is not one of auto,"),
        (["judge", "eval", "shipped", "--threshold", "1.5"], "error: --threshold must be between 0 and 1, got 1.5"),
        (["plan", GPU_EXAMPLE, "--device-memory=-1GiB"], "--device-memory: '-1GiB' is not a size"),
        (["plan", GPU_EXAMPLE, "--device-memory", "0"], "--device-memory: the device size must be above zero"),
    ],
)
def test_a_bad_option_gives_one_line_naming_it(argv, message, tmp_path, capsys):
    code = main([*argv, "--data-dir", str(tmp_path)])
    error = capsys.readouterr().err
    assert code == UsageError.exit_code
    assert message in error and error.count("\n") == 1 and "Traceback" not in error
    assert not (tmp_path / "jobs").exists()  # refused before anything was started or written


def test_judge_eval_names_a_job_without_a_judge(tmp_path, store_data_dir, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(QUESTION_JOB)
    code = main(["judge", "eval", "shipped", "--job", str(job), "--data-dir", str(store_data_dir)])
    assert code == UsageError.exit_code
    assert capsys.readouterr().err == f"error: --job {job}: the job has no 'judge' section to evaluate\n"


def test_eval_names_a_missing_adapter_folder(tmp_path, store_data_dir, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(QUESTION_JOB)
    code = main(["eval", str(job), "--adapter", str(tmp_path / "nowhere"), "--data-dir", str(store_data_dir)])
    error = capsys.readouterr().err
    assert code == UsageError.exit_code
    assert error.startswith(f"error: --adapter {tmp_path / 'nowhere'} holds no adapter_model.safetensors")
