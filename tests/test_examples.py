"""Every job file in examples/ is valid, and says how to run it.

CPU examples are checked in full against a model store holding the bundled
model. Files written for the GPU box name model folders there (absolute paths
absent on this machine); they get every check except the model one, as
`appliance config check --no-model-check` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from appliance.cli.main import EXIT_OK, main
from appliance.job_checks import check_job_file
from appliance.models.provision import DEMO_MODEL_NAME

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml")) + sorted(EXAMPLES_DIR.glob("*.yml"))


def model_references(path: Path) -> list[str]:
    data = yaml.safe_load(path.read_text())
    return [section["model"] for section in (data.get("student"), data.get("judge")) if isinstance(section, dict)]


def written_for_another_box(path: Path) -> bool:
    return any(Path(ref).is_absolute() and not Path(ref).exists() for ref in model_references(path))


def test_the_promised_examples_are_there():
    names = {path.name for path in EXAMPLES}
    assert {"multiply.yaml", "multiply-judge.yaml", "gsm8k-cpu.yaml", "gsm8k-qwen7b-gpu.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_is_valid(path: Path, store_data_dir):
    foreign = written_for_another_box(path)

    spec, errors = check_job_file(path, store_data_dir, check_models=not foreign)

    assert [str(error) for error in errors] == []
    if foreign:  # only absolute model folders may be skipped, never a misspelt store name
        assert all(Path(ref).is_absolute() for ref in model_references(path))
    assert spec.name


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_opens_with_what_it_does_and_how_to_run_it(path: Path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    text = "\n".join(header)
    assert len(header) >= 3, f"{path.name} must open with a comment saying what it does"
    assert f"appliance config check examples/{path.name}" in text
    assert f"appliance train examples/{path.name}" in text or f"appliance jobs submit examples/{path.name}" in text


def test_cpu_examples_pass_through_the_cli(store_data_dir, capsys):
    cpu_examples = [str(path) for path in EXAMPLES if not written_for_another_box(path)]

    code = main(["config", "check", *cpu_examples, "--data-dir", str(store_data_dir)])

    assert code == EXIT_OK, capsys.readouterr().err
    assert len(capsys.readouterr().out.splitlines()) == len(cpu_examples)


def test_cpu_demo_is_set_up_for_the_bundled_model_without_a_judge(store_data_dir):
    spec, _ = check_job_file(EXAMPLES_DIR / "multiply.yaml", store_data_dir)

    assert spec.student.model == DEMO_MODEL_NAME and spec.student.quantization == "nf4"
    assert spec.judge is None
    assert spec.task.dataset == "builtin:multiply"
    assert {reward.name for reward in spec.rewards} == {"correctness", "answer_format"}


def test_judge_demo_is_set_up_to_judge_with_the_bundled_model(store_data_dir):
    spec, _ = check_job_file(EXAMPLES_DIR / "multiply-judge.yaml", store_data_dir)

    assert spec.judge.model == DEMO_MODEL_NAME and spec.judge.mode == "pointwise"
    assert "judge" in {reward.name for reward in spec.rewards}


def test_gpu_example_uses_vllm_and_a_group_judge(store_data_dir):
    spec, _ = check_job_file(EXAMPLES_DIR / "gsm8k-qwen7b-gpu.yaml", store_data_dir, check_models=False)

    assert spec.student.model == "/models/Qwen2.5-7B-Instruct" and spec.student.quantization == "nf4"
    assert spec.judge.model == "/models/Qwen3-8B" and spec.judge.mode == "group"
    assert spec.engine.rollout == "vllm" and spec.device.memory_budget == "90%"


BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("path", sorted((BENCH_DIR / "jobs").glob("*.yaml")), ids=lambda path: path.name)
def test_bench_job_files_are_valid_with_the_bench_plugins_installed(path: Path, tmp_path):
    import shutil

    shutil.copytree(BENCH_DIR / "plugins", tmp_path / "plugins")  # as bench/memory_plan.py installs them
    spec, errors = check_job_file(path, tmp_path, check_models=False)
    assert [str(error) for error in errors] == []
    assert spec.name == path.stem
