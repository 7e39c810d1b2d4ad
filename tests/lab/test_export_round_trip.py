"""Export round trip: best/ of a trained job, loaded elsewhere, reproduces the job's held-out accuracy.

The adapter export is loaded the way a lab would, with transformers + peft on
the base quantized as in training, and must reproduce the accuracy the job
recorded. The merged export is loaded with transformers alone and must
reproduce the adapter applied to the store's original weights: the merge
starts from those, not from the 4-bit copy the student trained on. Both are
evaluated greedily on the job's held-out problems with the appliance's own
evaluation.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from appliance.cli.main import main
from appliance.engines.hf import HFEngine
from appliance.export import ExportError, export_job, verify_export
from appliance.grpo.evaluate import evaluate
from appliance.models.store import ModelStore

pytestmark = pytest.mark.model


def held_out_accuracy(trained_job, model, tokenizer) -> float:
    from appliance.config.job_file import load_job
    from appliance.tasks.load import load_task

    spec = load_job(trained_job.job_file)
    task = load_task(spec.task, trained_job.job_file.parent)
    tokenizer.padding_side = "left"
    return evaluate(
        HFEngine(model, tokenizer, name="export"), task, task.held_out, [], spec.grpo.max_new_tokens
    ).accuracy


def noise(accuracy: float, problems: int) -> float:
    """Two standard errors of an accuracy on `problems` problems (at least one problem)."""
    return max(2 * math.sqrt(max(accuracy * (1 - accuracy), 0.05) / problems), 1 / problems)


@pytest.fixture(scope="module")
def adapter_export(trained_job, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "adapter"
    assert main(["export", "lab-tiny", "--data-dir", str(trained_job.data_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def merged_export(trained_job, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "merged"
    result = export_job(trained_job.job_dir, trained_job.data_dir, out, checkpoint="best", merged=True)
    assert result.kind == "merged" and result.path == out.resolve()
    return out


def test_adapter_export_has_manifest_card_and_reproduces_accuracy(trained_job, adapter_export):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    manifest = verify_export(adapter_export)
    recorded = trained_job.evaluation
    assert manifest["kind"] == "adapter"
    assert manifest["source"]["job"] == "lab-tiny" and manifest["source"]["step"] == 1
    assert manifest["source"]["metric"]["name"] == "reward_mean"
    store_model = ModelStore(trained_job.data_dir).get("smollm2-135m-instruct")
    assert (
        manifest["base_model"]["files"]["model.safetensors"]
        == store_model.manifest["files"]["model.safetensors"]["sha256"]
    )
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "README.md"} <= set(manifest["files"])
    config = json.loads((adapter_export / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "smollm2-135m-instruct"
    card = (adapter_export / "README.md").read_text()
    assert "More Information Needed" not in card
    assert "builtin:multiply" in card and "| correctness | 1 |" in card and "| answer_format | 0.5 |" in card
    assert f"before training (base model): {recorded['before']['accuracy']:.1%}" in card
    assert f"after training: {recorded['after']['accuracy']:.1%} (step 1)" in card

    # Elsewhere: transformers + peft, the base quantized as the job trained it (export.json says how).
    assert manifest["base_model"]["training_quantization"] == "nf4"
    base = AutoModelForCausalLM.from_pretrained(
        str(store_model.path),
        dtype=torch.float32,
        device_map={"": "cpu"},
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        ),
    )
    model = PeftModel.from_pretrained(base, str(adapter_export))
    accuracy = held_out_accuracy(trained_job, model, AutoTokenizer.from_pretrained(str(adapter_export)))
    after = recorded["after"]["accuracy"]
    print(f"adapter export: held-out accuracy {accuracy:.1%}, job recorded {after:.1%}")
    assert abs(accuracy - after) <= noise(after, recorded["after"]["problems"])


def test_merged_export_is_made_from_the_original_weights(trained_job, merged_export):
    from safetensors.torch import load_file

    manifest = verify_export(merged_export)
    assert manifest["kind"] == "merged" and manifest["dtype"] == "bfloat16"
    merged = load_file(str(merged_export / "model.safetensors"))
    original = load_file(str(ModelStore(trained_job.data_dir).get("smollm2-135m-instruct").path / "model.safetensors"))
    adapter = load_file(str(trained_job.job_dir / "best" / "adapter_model.safetensors"))
    assert all(tensor.dtype == torch.bfloat16 for tensor in merged.values())
    # A layer without LoRA is the original weight in bf16, bit for bit (an NF4 round trip is not).
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(merged[name], original[name].to(torch.bfloat16))
    # A LoRA target is W + (alpha / r) B A, from the original W.
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    lora_a, lora_b = adapter[f"{prefix}.lora_A.weight"], adapter[f"{prefix}.lora_B.weight"]
    assert lora_b.abs().max() > 0  # training moved the adapter
    expected = original["model.layers.0.self_attn.q_proj.weight"] + (16 / 8) * lora_b @ lora_a
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"].float(), expected, atol=1e-2, rtol=1e-2)
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        original["model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16),
    )


def test_merged_export_loads_with_transformers_alone_and_reproduces_the_adapter_on_the_original_weights(
    trained_job, merged_export, adapter_export
):
    # The merge is onto the store's original weights (no NF4 round trip), not the 4-bit base the job trained
    # and evaluated on, so what it must reproduce is the adapter applied to those weights. The job's recorded
    # accuracy can differ by more than sampling noise: on these 8 problems the 4-bit base and the original
    # weights answer differently, and one run's adapter scored 50% on the first and 100% merged.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(merged_export), dtype=torch.float32, device_map={"": "cpu"})
    accuracy = held_out_accuracy(trained_job, model, AutoTokenizer.from_pretrained(str(merged_export)))
    original = ModelStore(trained_job.data_dir).get("smollm2-135m-instruct").path
    base = AutoModelForCausalLM.from_pretrained(str(original), dtype=torch.float32, device_map={"": "cpu"})
    adapted = PeftModel.from_pretrained(base, str(adapter_export))
    reference = held_out_accuracy(trained_job, adapted, AutoTokenizer.from_pretrained(str(adapter_export)))
    problems = trained_job.evaluation["after"]["problems"]
    print(f"merged export: held-out accuracy {accuracy:.1%}, adapter on the original weights {reference:.1%}")
    assert abs(accuracy - reference) <= noise(reference, problems)


def test_a_changed_file_is_caught_by_the_manifest(adapter_export, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(adapter_export, copy)
    assert main(["export", "--check", str(copy)]) == 0
    weights = copy / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportError, match="adapter_model.safetensors was changed"):
        verify_export(copy)
    capsys.readouterr()
    assert main(["export", "--check", str(copy)]) == 1
    assert "adapter_model.safetensors was changed" in capsys.readouterr().err


def test_export_refuses_an_existing_folder_and_an_unknown_checkpoint(trained_job, adapter_export, tmp_path):
    with pytest.raises(ExportError, match="already exists and is not empty"):
        export_job("lab-tiny", trained_job.data_dir, adapter_export)
    with pytest.raises(ExportError, match=r"no complete checkpoint at step 5 \(kept: step-1\)"):
        export_job("lab-tiny", trained_job.data_dir, tmp_path / "x", checkpoint="step-5")
    assert not (tmp_path / "x").exists()
    result = export_job(str(trained_job.job_dir), trained_job.data_dir, tmp_path / "latest", checkpoint="latest")
    assert result.step == 1 and verify_export(result.path)["source"]["checkpoint"] == "latest"


def test_a_merged_export_that_cannot_fit_in_host_memory_is_refused_before_loading(
    trained_job, demo_model_dir, tmp_path, monkeypatch
):
    from appliance.export import exporter, memory

    parameters = memory.parameter_count(demo_model_dir)  # SmolLM2-135M, tied embeddings counted once
    assert 130e6 < parameters < 140e6
    needed = memory.merged_export_bytes(demo_model_dir, "bfloat16")
    assert needed == parameters * (4 + 2) + memory.RUNTIME_BYTES
    # The host memory probe is the boundary: this box is told it has a byte less than the export needs.
    monkeypatch.setattr(exporter, "available_host_bytes", lambda: needed - 1)
    out = tmp_path / "merged"
    with pytest.raises(ExportError, match=r"needs about .* GiB of host memory .* export the adapter alone"):
        export_job(trained_job.job_dir, trained_job.data_dir, out, checkpoint="best", merged=True)
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing loaded, nothing staged
