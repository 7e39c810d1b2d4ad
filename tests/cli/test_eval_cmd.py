"""`appliance eval` through the real CLI entry: agent jobs (success over held-out scenarios), sampled evaluation
from the job's keys or --temperature / --samples, and one clear error for what cannot be evaluated."""

from __future__ import annotations

import json
import pytest
import yaml
from tiny_model import tiny_job

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_OK, main

QUESTION_JOB = """\
name: questions
student: {model: smollm2-135m-instruct}
task: {dataset: builtin:multiply, held_out: 4}
rewards: [{name: correctness}]
"""

AGENT_JOB = """\
name: agent
student: {model: smollm2-135m-instruct}
task: {environment: "builtin:calculator", max_turns: 2}
rewards: [{name: environment}]
"""


def test_greedy_samples_are_refused_naming_the_flags(tmp_path, store_data_dir, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(QUESTION_JOB)
    code = main(["eval", str(job), "--samples", "3", "--data-dir", str(store_data_dir)])
    error = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert (
        error.startswith("error: --temperature 0 with --samples 3") and "greedy samples would all be the same" in error
    )


def test_an_agent_job_takes_no_dataset(tmp_path, store_data_dir, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(AGENT_JOB)
    (tmp_path / "rows.jsonl").write_text('{"question": "What is 2 * 3?", "answer": "6"}\n')
    code = main(["eval", str(job), "--data", str(tmp_path / "rows.jsonl"), "--data-dir", str(store_data_dir)])
    assert code == EXIT_BAD_INPUT
    assert "is an agent job (task.environment builtin:calculator)" in capsys.readouterr().err


@pytest.mark.model
def test_an_agent_job_is_evaluated_on_its_environment_sampled_as_asked(
    tiny_model_dir, tmp_path, fresh_data_dir, capsys
):
    job = yaml.safe_load(tiny_job(tiny_model_dir, tmp_path).read_text())
    job["task"] = {"environment": "builtin:calculator", "max_turns": 1}
    job["rewards"] = [{"name": "environment"}]
    job["checkpoint"] = {"eval_limit": 2, "eval_temperature": 1.0, "eval_samples": 3}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(job))

    assert main(["eval", str(path), "--json", "--data-dir", str(fresh_data_dir)]) == EXIT_OK
    from_keys = json.loads(capsys.readouterr().out)
    assert (from_keys["problems"], from_keys["samples"], from_keys["draws"], from_keys["temperature"]) == (2, 3, 6, 1.0)
    assert from_keys["adapter"] is None and from_keys["examples"][0]["messages"][0]["role"] == "system"

    assert (
        main(
            [
                "eval",
                str(path),
                "--temperature",
                "0",
                "--samples",
                "1",
                "--limit",
                "1",
                "--data-dir",
                str(fresh_data_dir),
            ]
        )
        == EXIT_OK
    )
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("tiny (base model) on 1 scenarios: success ") and "temperature" not in line


def test_question_job_keys_are_read_from_the_job(tmp_path, store_data_dir, capsys):
    """A bad key in the job file is the job file's error, before any model is loaded."""
    job = tmp_path / "job.yaml"
    job.write_text(QUESTION_JOB + "checkpoint: {eval_samples: 2}\n")
    assert main(["eval", str(job), "--data-dir", str(store_data_dir)]) == EXIT_BAD_INPUT
    assert "checkpoint: eval_samples: 2 greedy samples would all be the same" in capsys.readouterr().err
