"""The `judge:` section for a judge at an endpoint: what is checked, at which key, and what is made absolute."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.job_checks import check_job_file, load_checked_job

JOB = """\
name: remote-judge
student:
  model: smollm2-135m-instruct
judge:
  endpoint: {endpoint}
  model: Qwen/Qwen3-8B
  token_file: {token_file}
  mode: group
rewards:
  - {{name: correctness, weight: 1.0}}
  - {{name: judge, weight: 0.5}}
"""


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    (tmp_path / "data" / "models").mkdir(parents=True)
    return tmp_path / "data"


def write(tmp_path: Path, endpoint: str, token_file: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(endpoint=endpoint, token_file=token_file))
    return path


def messages(path: Path, data_dir: Path) -> list[str]:
    _, errors = check_job_file(path, data_dir)
    return [str(error) for error in errors]


def test_remote_judge_model_is_not_looked_up_in_the_store(tmp_path, data_dir):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "judge.token").write_text("abc\n")
    path = write(tmp_path, "http://judge.lab:8000/v1", "secrets/judge.token")
    found = messages(path, data_dir)
    # The student is not in this empty store (an error), the remote judge's model is not looked up (none).
    assert any("student.model" in m for m in found) and not any("judge.model" in m for m in found)


def test_bad_endpoint_and_missing_token_file_are_reported_at_their_keys(tmp_path, data_dir):
    found = messages(write(tmp_path, "judge.lab:8000", "nowhere.token"), data_dir)
    assert any("judge.endpoint" in m and "http(s) URL" in m for m in found)
    found = messages(write(tmp_path, "http://user:pw@judge.lab/v1", "nowhere.token"), data_dir)
    assert any("judge.endpoint" in m and "without credentials" in m for m in found)
    found = messages(write(tmp_path, "http://judge.lab:8000/v1", "nowhere.token"), data_dir)
    assert any("judge.token_file" in m and str(tmp_path / "nowhere.token") in m for m in found)


def test_loaded_spec_carries_the_absolute_token_file(tmp_path, store_data_dir):
    (tmp_path / "judge.token").write_text("abc\n")
    spec = load_checked_job(write(tmp_path, "https://judge.lab/v1", "judge.token"), store_data_dir)
    assert spec.judge.token_file == str(tmp_path / "judge.token")
    assert spec.judge.endpoint == "https://judge.lab/v1" and spec.judge.model == "Qwen/Qwen3-8B"
