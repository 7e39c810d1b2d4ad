"""The model store on real files: import with a manifest, verification that names the bad file, idempotent provisioning."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from appliance.models.provision import DEMO_MODEL_NAME, provision_demo
from appliance.models.store import MANIFEST, ModelStore, ModelStoreError, resolve_model, sha256_file

# Copies and hashes the real 540 MB model: the real-model tier.
pytestmark = pytest.mark.model

SMOLLM2_135M_PARAMETERS = 134_515_008  # tied input/output embeddings counted once


@pytest.fixture(scope="module")
def imported(tmp_path_factory, demo_model_dir):
    """The demo folder imported under another name into a fresh data dir (one 540 MB copy per module)."""
    data_dir = tmp_path_factory.mktemp("data")
    model = ModelStore(data_dir).import_folder(demo_model_dir, "imported-smollm2")
    return data_dir, model


def linked_store(source_data_dir: Path, name: str, target_data_dir: Path) -> ModelStore:
    """A second store whose copy of `name` shares file contents by hard links (no 540 MB copy)."""
    source = ModelStore(source_data_dir).path_of(name)
    shutil.copytree(source, ModelStore(target_data_dir).path_of(name), copy_function=os.link)
    return ModelStore(target_data_dir)


def test_import_copies_the_model_files_and_hashes_each(imported, demo_model_dir):
    data_dir, model = imported
    manifest = json.loads((model.path / MANIFEST).read_text())

    assert ModelStore(data_dir).names() == ["imported-smollm2"]
    assert manifest["architecture"] == "LlamaForCausalLM"
    assert manifest["parameters"] == SMOLLM2_135M_PARAMETERS
    assert manifest["dtype"] == "F32"
    assert manifest["source"] == str(demo_model_dir)
    source_files = {p.name for p in demo_model_dir.iterdir() if p.is_file() and p.name != MANIFEST}
    assert set(manifest["files"]) == source_files
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= source_files
    for file_name, entry in manifest["files"].items():
        assert entry["bytes"] == (demo_model_dir / file_name).stat().st_size
        assert entry["sha256"] == sha256_file(demo_model_dir / file_name)
    assert ModelStore(data_dir).verify("imported-smollm2").size_bytes == sum(
        e["bytes"] for e in manifest["files"].values()
    )


def test_import_refuses_a_name_already_taken(imported, demo_model_dir):
    data_dir, _ = imported

    with pytest.raises(ModelStoreError, match="model 'imported-smollm2' already exists in the store"):
        ModelStore(data_dir).import_folder(demo_model_dir, "imported-smollm2")


def test_import_refuses_a_folder_without_weights(tmp_path, demo_model_dir):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    shutil.copy(demo_model_dir / "config.json", folder)

    with pytest.raises(ModelStoreError, match=r"has no \*\.safetensors weights"):
        ModelStore(tmp_path / "data").import_folder(folder, "broken")
    assert ModelStore(tmp_path / "data").names() == []


def test_altered_weight_file_is_caught_and_named(imported, tmp_path):
    store = linked_store(imported[0], "imported-smollm2", tmp_path / "data")
    weights = store.path_of("imported-smollm2") / "model.safetensors"
    weights.unlink()  # break the hard link before changing the content
    shutil.copyfile(imported[1].path / "model.safetensors", weights)
    with open(weights, "r+b") as handle:  # one flipped byte in the middle: same size, different hash
        handle.seek(weights.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))

    with pytest.raises(ModelStoreError) as raised:
        store.verify("imported-smollm2")

    assert str(weights) in str(raised.value)
    assert "does not match its manifest" in str(raised.value)
    assert store.check_status("imported-smollm2").startswith("bad: ")


def test_missing_file_is_caught_and_named(imported, tmp_path):
    store = linked_store(imported[0], "imported-smollm2", tmp_path / "data")
    tokenizer = store.path_of("imported-smollm2") / "tokenizer.json"
    tokenizer.unlink()

    with pytest.raises(ModelStoreError) as raised:
        store.verify("imported-smollm2")

    assert f"file {tokenizer} listed in its manifest is missing" in str(raised.value)


def test_resolve_model_takes_a_store_name_or_a_folder(imported, tmp_path):
    data_dir, model = imported

    assert resolve_model("imported-smollm2", data_dir) == model.path
    assert resolve_model(str(model.path), data_dir) == model.path
    with pytest.raises(ModelStoreError, match="is not in the store"):
        resolve_model("absent-model", data_dir)
    with pytest.raises(ModelStoreError, match="has no config.json"):
        resolve_model(str(tmp_path), data_dir)


def test_provisioning_twice_is_a_quick_no_op(store_data_dir):
    first, _ = provision_demo(store_data_dir)

    started = time.monotonic()
    again, created = provision_demo(store_data_dir)
    elapsed_seconds = time.monotonic() - started

    assert created is False
    assert again.path == first.path == ModelStore(store_data_dir).path_of(DEMO_MODEL_NAME)
    assert elapsed_seconds < 1.0
