"""The job-file API the trainer and daemon call: check_job_file, load_checked_job, parse_job."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from appliance.job_checks import check_job_file, load_checked_job
from appliance.config.job_file import JobFileError, parse_job

GOOD_JOB = """\
name: plugin-job
student:
  model: smollm2-135m-instruct
task:
  dataset: data/train.jsonl
  held_out: 1
rewards:
  - {name: correctness, weight: 1.0}
  - {name: plugins/brevity.py:brevity, weight: 0.25}
"""

PLUGIN = """\
import pathlib

pathlib.Path(__file__).with_name("imported.marker").write_text("the plugin ran")


def brevity(prompt, completion, reference, metadata):
    return 1.0 if len(completion) < 40 else 0.0
"""

ROWS = '{"question": "What is 2 * 3?", "answer": "6"}\n{"question": "What is 4 * 5?", "answer": "20"}\n'


@pytest.fixture
def job_folder(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(ROWS)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "brevity.py").write_text(PLUGIN)
    (tmp_path / "job.yaml").write_text(GOOD_JOB)
    return tmp_path


def test_valid_job_gets_absolute_dataset_and_plugin_paths(job_folder, store_data_dir):
    spec, errors = check_job_file(job_folder / "job.yaml", store_data_dir)

    assert errors == []
    assert spec.name == "plugin-job"
    assert spec.task.dataset == str(job_folder / "data" / "train.jsonl")
    assert [r.name for r in spec.rewards] == ["correctness", f"{job_folder / 'plugins' / 'brevity.py'}:brevity"]
    assert spec.student.model == "smollm2-135m-instruct"  # store names stay names


def test_checking_never_runs_the_plugin(job_folder, store_data_dir):
    check_job_file(job_folder / "job.yaml", store_data_dir)

    assert not (job_folder / "plugins" / "imported.marker").exists()


def test_relative_model_folder_is_resolved_from_the_job_folder(job_folder, store_data_dir, demo_model_dir):
    (job_folder / "weights").symlink_to(demo_model_dir)
    text = GOOD_JOB.replace("model: smollm2-135m-instruct", "model: ./weights")
    (job_folder / "job.yaml").write_text(text)

    spec = load_checked_job(job_folder / "job.yaml", store_data_dir)

    assert spec.student.model == str(job_folder / "weights")


def test_load_checked_job_raises_with_every_error(job_folder, store_data_dir):
    text = GOOD_JOB.replace("smollm2-135m-instruct", "smollm").replace("held_out: 1", "held_out: -1")
    (job_folder / "job.yaml").write_text(text)

    with pytest.raises(JobFileError) as raised:
        load_checked_job(job_folder / "job.yaml", store_data_dir)

    keys = [(e.key, e.line) for e in raised.value.errors]
    assert keys == [("student.model", 3), ("task.held_out", 6)]
    assert str(raised.value).splitlines()[0].startswith(f"{job_folder / 'job.yaml'}:3:student.model: model 'smollm'")


def test_model_check_can_be_skipped_for_another_box(tmp_path, store_data_dir):
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent("""\
        name: gpu-job
        student: {model: /models/Qwen2.5-7B-Instruct}
        judge: {model: /models/Qwen3-8B, mode: group}
        task: {dataset: builtin:gsm8k}
        rewards: [{name: correctness}, {name: judge}]
        """)
    )

    spec, skipped = check_job_file(tmp_path / "job.yaml", store_data_dir, check_models=False)
    _, checked = check_job_file(tmp_path / "job.yaml", store_data_dir)

    assert skipped == [] and spec.judge.model == "/models/Qwen3-8B"
    assert [(e.key, e.line) for e in checked] == [("student.model", 2), ("judge.model", 3)]


def test_empty_model_store_says_how_to_fill_it(tmp_path):
    (tmp_path / "job.yaml").write_text(
        "name: t\nstudent: {model: smollm2-135m-instruct}\nrewards: [{name: correctness}]\ntask: {held_out: 21}\n"
    )

    _, errors = check_job_file(tmp_path / "job.yaml", tmp_path / "empty-data-dir")

    assert len(errors) == 1
    assert "appliance models provision-demo" in errors[0].message


def test_schema_and_outside_world_errors_come_together_in_line_order(tmp_path, store_data_dir):
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent("""\
        name: t
        student:
          model: smollm2-135m-instruk
        grpo:
          group_size: 1
        rewards:
          - {name: judge}
        """)
    )

    spec, errors = check_job_file(tmp_path / "job.yaml", store_data_dir)

    assert spec is None
    assert [(e.line, e.key) for e in errors] == [(3, "student.model"), (5, "grpo.group_size"), (7, "rewards[0].name")]


def test_judge_reward_is_accepted_with_a_judge_section(tmp_path, store_data_dir):
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        judge: {model: smollm2-135m-instruct}
        task: {held_out: 21}
        rewards: [{name: judge}]
        """)
    )

    spec, errors = check_job_file(tmp_path / "job.yaml", store_data_dir)

    assert errors == [] and spec.judge.mode == "pointwise"


def test_parse_job_keeps_the_line_of_every_key():
    parsed = parse_job("name: t\nstudent:\n  model: m\nrewards:\n  - name: a\n  - name: b\n", "job.yaml")

    assert parsed.errors == [] and parsed.spec.rewards[1].name == "b"
    assert parsed.lines[("student", "model")] == 3
    assert parsed.lines[("rewards", 1, "name")] == 6
    assert str(parsed.error_at(("rewards", 1, "weight"), "x")) == "job.yaml:6:rewards[1].weight: x"


def test_unreadable_job_file_is_one_error_naming_it(tmp_path, store_data_dir):
    spec, errors = check_job_file(tmp_path / "absent.yaml", store_data_dir)

    assert spec is None
    assert [str(e) for e in errors] == [
        f"{tmp_path / 'absent.yaml'}:(top): cannot read the job file: No such file or directory"
    ]


@pytest.mark.parametrize(
    "checkpoint, expected",
    [
        (
            "{best_metric: reward_maen}",
            "checkpoint.best_metric: unknown metric 'reward_maen'; did you mean 'reward_mean'?",
        ),
        (
            "{best_metric: rewards.corectness.mean}",
            "checkpoint.best_metric: unknown metric 'rewards.corectness.mean'; did you mean 'rewards.correctness.mean'?",
        ),
        (
            "{best_metric: eval.accuracy, eval_every: null}",
            "checkpoint.best_metric: 'eval.accuracy' is measured only when the job evaluates held-out problems",
        ),
        ("{best_metric: loss, best_mode: lowest}", "checkpoint.best_mode: Input should be 'max' or 'min'"),
        (
            "{eval_samples: 4}",
            "checkpoint: eval_samples: 4 greedy samples would all be the same; set eval_temperature "
            "above 0 (e.g. 1.0) or eval_samples: 1",
        ),
        ("{eval_temperature: -0.5}", "checkpoint.eval_temperature: Input should be greater than or equal to 0"),
        ("{eval_temperature: 3}", "checkpoint.eval_temperature: Input should be less than or equal to 2"),
        (
            "{eval_temperature: 1.0, eval_samples: 0}",
            "checkpoint.eval_samples: Input should be greater than or equal to 1",
        ),
        ("{eval_temperature: 1.0, eval_sample: 4}", "checkpoint.eval_sample"),
    ],
)
def test_checkpoint_keys_are_validated_at_their_key(job_folder, store_data_dir, checkpoint, expected):
    """best_metric and best_mode, and the sampled-evaluation keys eval_temperature and eval_samples."""
    job = job_folder / "job.yaml"
    job.write_text(GOOD_JOB + f"checkpoint: {checkpoint}\n")
    _, errors = check_job_file(job, store_data_dir)
    assert any(expected in str(error) for error in errors), [str(e) for e in errors]
    assert all(error.line == 10 for error in errors), [e.line for e in errors]


def test_a_per_reward_or_held_out_best_metric_is_accepted(job_folder, store_data_dir):
    job = job_folder / "job.yaml"
    job.write_text(GOOD_JOB + "checkpoint: {best_metric: rewards.correctness.mean, best_mode: max}\n")
    assert check_job_file(job, store_data_dir)[1] == []
    job.write_text(GOOD_JOB + "checkpoint: {eval_every: 5, eval_limit: 50, best_metric: eval.accuracy}\n")
    spec, errors = check_job_file(job, store_data_dir)
    assert errors == [] and (spec.checkpoint.eval_every, spec.checkpoint.eval_limit) == (5, 50)


def test_evaluation_is_greedy_unless_the_job_asks_for_samples(job_folder, store_data_dir):
    job = job_folder / "job.yaml"
    job.write_text(GOOD_JOB)
    spec, errors = check_job_file(job, store_data_dir)
    assert errors == [] and (spec.checkpoint.eval_temperature, spec.checkpoint.eval_samples) == (0.0, 1)
    job.write_text(GOOD_JOB + "checkpoint: {eval_temperature: 0.7, eval_samples: 8, eval_limit: 20}\n")
    spec, errors = check_job_file(job, store_data_dir)
    assert errors == [] and (spec.checkpoint.eval_temperature, spec.checkpoint.eval_samples) == (0.7, 8)
    job.write_text(GOOD_JOB + "checkpoint: {eval_temperature: 1.0}\n")  # one sampled draw per problem is allowed
    assert check_job_file(job, store_data_dir)[1] == []
