"""`appliance plan` through the real CLI entry: fits (0), does not fit (3), bad input (2), --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.budget.shapes import fixture_for
from appliance.cli.main import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_OK, main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GPU_EXAMPLE = str(EXAMPLES / "gsm8k-qwen7b-gpu.yaml")


def test_80gib_fits_and_prints_each_phase_against_the_budget(capsys, tmp_path):
    assert main(["plan", GPU_EXAMPLE, "--device-memory", "80GiB", "--data-dir", str(tmp_path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "shipped shape Qwen2.5-7B" in out and "shipped shape Qwen3-8B" in out
    assert "generate" in out and "judge" in out and "train" in out
    assert "budget 72.00 GiB" in out and "fits: peak" in out


def test_24gib_exits_3_with_the_overflow_and_a_change_that_fits(capsys, tmp_path):
    code = main(["plan", GPU_EXAMPLE, "--device-memory", "24GiB", "--data-dir", str(tmp_path)])
    assert code == EXIT_DOES_NOT_FIT
    captured = capsys.readouterr()
    assert "overflowing: judge_weights 15.26 GiB" in captured.out
    assert "judge.quantization: nf4" in captured.out
    assert "more than the 21.60 GiB budget (overflowing: judge_weights); change judge.quantization: nf4" in captured.err


def test_24gib_with_the_suggested_change_fits_time_shared(capsys, tmp_path):
    changed = tmp_path / "job.yaml"
    changed.write_text(Path(GPU_EXAMPLE).read_text().replace("quantization: none", "quantization: nf4"))
    assert main(["plan", str(changed), "--device-memory", "24GiB", "--json", "--data-dir", str(tmp_path)]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["fits"] and document["choices"]["time_share"] is True
    assert document["choices"]["micro_batch_size"] < 256


def test_8gib_refuses(capsys, tmp_path):
    assert main(["plan", GPU_EXAMPLE, "--device-memory", "8GiB", "--data-dir", str(tmp_path)]) == EXIT_DOES_NOT_FIT
    assert "does not fit" in capsys.readouterr().err


def test_json_is_one_document_in_bytes(capsys, tmp_path):
    assert main(["plan", GPU_EXAMPLE, "--device-memory", "80GiB", "--json", "--data-dir", str(tmp_path)]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["device"] == {
        "kind": "cuda",
        "name": "(--device-memory)",
        "total_bytes": 80 * 2**30,
        "used_bytes": 0,
        "bf16_matmul": True,  # --device-memory: a GPU of that size
    }
    assert document["budget_bytes"] == int(0.9 * 80 * 2**30)
    assert document["peak_bytes"] <= document["budget_bytes"]
    assert document["model_configs"]["judge"] == "shipped shape Qwen3-8B"


def test_model_config_overrides_the_shipped_shape(capsys, tmp_path):
    # Plan the Qwen2.5 student with Llama-3.1-8B's shape: its 128 KiB per token KV cache shows up.
    llama = fixture_for("Llama-3.1-8B")
    assert main(
        [
            "plan",
            GPU_EXAMPLE,
            "--device-memory",
            "80GiB",
            "--json",
            "--data-dir",
            str(tmp_path),
            "--model-config",
            f"/models/Qwen2.5-7B-Instruct={llama}",
        ]
    ) in (EXIT_OK, EXIT_DOES_NOT_FIT)
    document = json.loads(capsys.readouterr().out)
    assert document["model_configs"]["student"] == str(llama)
    choices = document["choices"]
    assert choices["rollout_kv_bytes"] == choices["rollout_batch"] * (512 + 768) * 128 * 1024


def test_the_bundled_model_is_planned_from_the_model_store_on_the_cpu(capsys, store_data_dir):
    code = main(
        [
            "plan",
            str(EXAMPLES / "multiply-judge.yaml"),
            "--device",
            "cpu",
            "--device-memory",
            "16GiB",
            "--json",
            "--data-dir",
            str(store_data_dir),
        ]
    )
    assert code == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["model_configs"]["student"].endswith("smollm2-135m-instruct/config.json")
    assert document["compute_dtype"] == "float32" and document["engines"]["rollout"] == "hf"


def test_a_model_without_a_config_says_how_to_supply_one(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: t\nstudent: {model: /models/Mistral-7B-v0.3}\nrewards: [{name: correctness}]\n")
    assert main(["plan", str(job), "--device-memory", "80GiB", "--data-dir", str(tmp_path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "student.model" in err and "--model-config /models/Mistral-7B-v0.3=path/to/config.json" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device-memory", "lots"], "--device-memory: 'lots' is not a size"),
        (["--device-memory", "80GiB", "--model-config", "nonsense"], "write NAME=path/to/config.json"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(capsys, tmp_path, args, message):
    assert main(["plan", GPU_EXAMPLE, "--data-dir", str(tmp_path), *args]) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_an_invalid_job_file_exits_2_with_its_errors(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: t\nstudent: {model: x}\nrewards: [{name: correctness}]\ngrpo: {group_sise: 4}\n")
    assert main(["plan", str(job), "--device-memory", "8GiB"]) == EXIT_BAD_INPUT
    assert "grpo.group_sise" in capsys.readouterr().err
