"""`appliance config check` through the real CLI entry: several files, all errors, --json, --no-model-check."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from appliance.cli.main import EXIT_BAD_INPUT, EXIT_OK, main

REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

VALID = """\
name: ok-job
student: {model: smollm2-135m-instruct}
task: {dataset: builtin:multiply, held_out: 21}
rewards: [{name: correctness}]
"""

THREE_MISTAKES = """\
name: three
student:
  model: smollm2-135m-instruct
  quantisation: nf4
grpo:
  epsilon: 0
task: {dataset: builtin:multiply, held_out: 21}
rewards:
  - {name: strict_formt}
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {"valid": tmp_path / "valid.yaml", "three": tmp_path / "three.yaml", "empty": tmp_path / "empty.yaml"}
    paths["valid"].write_text(VALID)
    paths["three"].write_text(THREE_MISTAKES)
    paths["empty"].write_text("")
    return paths


def test_valid_file_exits_0_and_says_ok(files, store_data_dir, capsys):
    code = main(["config", "check", str(files["valid"]), "--data-dir", str(store_data_dir)])

    out, err = capsys.readouterr()
    assert code == EXIT_OK
    assert out == f"{files['valid']}: ok (ok-job)\n"
    assert err == ""


def test_three_mistakes_give_three_lines(files, store_data_dir, capsys):
    code = main(["config", "check", str(files["three"]), "--data-dir", str(store_data_dir)])

    lines = capsys.readouterr().err.splitlines()
    assert code == EXIT_BAD_INPUT
    path = files["three"]
    assert lines == [
        f"{path}:4:student.quantisation: unknown key; did you mean 'quantization'?",
        f"{path}:6:grpo.epsilon: Input should be greater than 0 (got 0)",
        f"{path}:9:rewards[0].name: unknown reward 'strict_formt'; did you mean 'strict_format'? "
        "(or a plugin: path/to/file.py:function)",
    ]


def test_several_files_report_every_error_of_every_file(files, store_data_dir, capsys):
    code = main(
        [
            "config",
            "check",
            str(files["three"]),
            str(files["valid"]),
            str(files["empty"]),
            "--data-dir",
            str(store_data_dir),
        ]
    )

    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT
    assert out == f"{files['valid']}: ok (ok-job)\n"
    by_file = [line.split(":", 1)[0] for line in err.splitlines()]
    assert by_file == [str(files["three"])] * 3 + [str(files["empty"])]


def test_json_document_lists_errors_per_file(files, store_data_dir, capsys):
    code = main(
        ["config", "check", str(files["valid"]), str(files["three"]), "--json", "--data-dir", str(store_data_dir)]
    )

    out, err = capsys.readouterr()
    document = json.loads(out)
    assert code == EXIT_BAD_INPUT and err == ""
    assert document["valid"] is False
    valid, three = document["files"]
    assert valid == {"file": str(files["valid"]), "valid": True, "name": "ok-job", "errors": []}
    assert three["valid"] is False and three["name"] is None
    assert [(e["line"], e["key"]) for e in three["errors"]] == [
        (4, "student.quantisation"),
        (6, "grpo.epsilon"),
        (9, "rewards[0].name"),
    ]


def test_no_model_check_accepts_models_of_another_box(tmp_path, capsys):
    job = tmp_path / "gpu.yaml"
    job.write_text(
        textwrap.dedent("""\
        name: gpu
        student: {model: /models/Qwen2.5-7B-Instruct}
        task: {dataset: builtin:gsm8k}
        rewards: [{name: correctness}]
        """)
    )
    empty_data_dir = tmp_path / "data"

    checked = main(["config", "check", str(job), "--data-dir", str(empty_data_dir)])
    checked_err = capsys.readouterr().err
    skipped = main(["config", "check", str(job), "--no-model-check", "--data-dir", str(empty_data_dir)])

    assert checked == EXIT_BAD_INPUT
    assert (
        checked_err == f"{job}:2:student.model: model folder /models/Qwen2.5-7B-Instruct does not exist; "
        "give a Hugging Face model folder or a name from the model store\n"
    )
    assert skipped == EXIT_OK


def test_data_dir_comes_from_the_environment(files, store_data_dir, monkeypatch, capsys):
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(store_data_dir))

    assert main(["config", "check", str(files["valid"])]) == EXIT_OK


def test_missing_file_argument_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["config", "check"])

    assert exited.value.code == EXIT_BAD_INPUT
    assert "FILE" in capsys.readouterr().err
