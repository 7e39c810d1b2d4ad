"""Checks against the box stay bounded and confined: datasets are counted row by row (never held), free-form
environment options are checked against the environment's own parameters, and a model folder is confined to
the model store and the administrator's roots, refused in one sentence that names the key and nothing else."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from store_support import link_model_store

from appliance.config.limits import MAX_DATASET_ROW_BYTES
from appliance.job_checks import check_job_file, confined_model_problem
from appliance.tasks.jsonl import count_problems
from appliance.tasks.task import TaskError

AGENT_JOB = """\
name: agent
student: {{model: smollm2-135m-instruct}}
task:
  environment: {environment}
  environment_options: {options}
rewards: [{{name: environment}}]
"""


def test_a_dataset_is_counted_row_by_row_and_none_is_kept(tmp_path):
    rows = tmp_path / "many.jsonl"
    with open(rows, "w") as handle:
        for number in range(200_000):
            handle.write(json.dumps({"question": f"What is {number} + 1?", "answer": str(number + 1)}) + "\n")
    tracemalloc.start()
    assert count_problems(rows) == 200_000
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * 2**20, f"counting held {peak} bytes: the rows were kept"


def test_dataset_rows_are_under_the_string_rule_and_the_line_cap(tmp_path):
    dirty = tmp_path / "dirty.jsonl"
    dirty.write_text(
        json.dumps({"question": "fine", "answer": "1"})
        + "\n"
        + json.dumps({"question": "\u001b]52;c;Y3VybCBldmlsIHwgc2g=\u0007", "answer": "2"})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "x\u0085"}]})
        + "\n"
        + json.dumps({"question": "q", "answer": "1", "metadata": {"k\u009b": "v"}})
        + "\n"
    )
    with pytest.raises(TaskError) as refused:
        count_problems(dirty)
    text = str(refused.value)
    assert "3 bad line(s)" in text and ":2: 'question' contains a control character (U+001B)" in text
    assert ":3: messages[0].content contains a control character (U+0085)" in text and ":4:" in text
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"question": "x" * (MAX_DATASET_ROW_BYTES + 10), "answer": "1"}) + "\n")
    with pytest.raises(TaskError, match=f"over the limit of {MAX_DATASET_ROW_BYTES} bytes"):
        count_problems(long)


@pytest.mark.parametrize(
    "environment, options, expected",
    [
        ("builtin:calculator", "{operand_maxx: 50}", "has no option 'operand_maxx'; did you mean 'operand_max'?"),
        ("builtin:calculator", "{operand_max: '50'}", "option 'operand_max' must be an integer"),
        ("builtin:calculator", "{operand_max: 100000}", "option 'operand_max' must be within 0..500, not 100000"),
        ("builtin:game2048", "{worked_examples: 9}", "must be within 0..8"),
        ("builtin:email_search", "{held_out_fraction: 2}", "must be within 0.0..1.0"),
        ("external", "{anything: 1}", "environment 'external' takes no options"),
        ("plugin_env.py:Env", "{sped: 2}", "has no option 'sped'; did you mean 'speed'?"),
    ],
)
def test_environment_options_are_checked_against_the_environments_parameters(
    tmp_path, store_data_dir, environment, options, expected
):
    data_dir = link_model_store(store_data_dir, tmp_path / "data")
    plugins = data_dir / "plugins"
    plugins.mkdir()
    (plugins / "plugin_env.py").write_text(
        "import os\nos.system('touch /tmp/appliance-plugin-ran')\n"
        "class Env:\n    def __init__(self, speed: int = 1, *, size=3):\n        pass\n"
    )
    job = tmp_path / "agent.yaml"
    job.write_text(AGENT_JOB.format(environment=environment, options=options))
    spec, errors = check_job_file(job, data_dir)
    assert spec is None
    [error] = [e for e in errors if e.key.startswith("task.environment_options")]
    assert expected in error.message and error.line == 5
    assert not Path("/tmp/appliance-plugin-ran").exists(), "checking the options ran the plugin"


def test_options_an_environment_takes_are_accepted(tmp_path, store_data_dir):
    job = tmp_path / "agent.yaml"
    job.write_text(AGENT_JOB.format(environment="builtin:calculator", options="{operand_min: 11, operand_max: 40}"))
    spec, errors = check_job_file(job, store_data_dir)
    assert errors == [] and spec.task.environment_options == {"operand_min": 11, "operand_max": 40}


@pytest.fixture
def roots(tmp_path):
    """A model store and an administrator's root holding one model folder; a secret outside both."""
    store, root, outside = tmp_path / "models", tmp_path / "admin-models", tmp_path / "home"
    for folder in (store, root / "good", outside / "mine"):
        folder.mkdir(parents=True)
    (root / "good" / "config.json").write_text("{}")
    (outside / "mine" / "config.json").write_text("{}")
    (outside / "judge.token").write_text("secret")
    return store, root, outside


def test_a_model_folder_outside_the_roots_is_refused_in_one_sentence_that_reveals_nothing(roots, tmp_path):
    store, root, outside = roots
    allowed = (store, root)
    existing = confined_model_problem(str(outside / "mine"), "student.model", allowed, tmp_path)
    missing = confined_model_problem(str(outside / "nowhere"), "student.model", allowed, tmp_path)
    assert existing.replace("mine", "X") == missing.replace("nowhere", "X"), "the answer tells what exists"
    assert existing.startswith("student.model must name a model in the model store")
    assert existing.count(". ") == 0 and existing.endswith("ask an administrator to import it")
    assert confined_model_problem("relative/folder", "judge.model", allowed, tmp_path).startswith("judge.model must")
    assert confined_model_problem(str(root / "good"), "student.model", allowed, tmp_path) is None


def test_no_link_leads_a_model_folder_out_of_its_root(roots, tmp_path):
    store, root, outside = roots
    allowed = (store, root)
    (root / "escape").symlink_to(outside / "mine")  # the folder itself is a link out
    assert confined_model_problem(str(root / "escape"), "student.model", allowed, tmp_path).startswith(
        "student.model must name"
    )
    (root / "good" / "tokenizer_config.json").symlink_to(outside / "judge.token")  # a file inside links out
    problem = confined_model_problem(str(root / "good"), "student.model", allowed, tmp_path)
    assert "'tokenizer_config.json', a link out of" in problem
    (root / "good" / "tokenizer_config.json").unlink()
    (root / "good" / "inside.json").symlink_to(root / "good" / "config.json")  # a link within the root is fine
    assert confined_model_problem(str(root / "good"), "student.model", allowed, tmp_path) is None
    os.unlink(root / "good" / "inside.json")
