"""Fast checks of the export's own parts on real files: the manifest and which adapter a selector picks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from appliance.export import ExportError, verify_export
from appliance.export.manifest import tree_digest, write_export_manifest
from appliance.export.source import find_adapter, find_job

SPEC = {"name": "unit-job", "student": {"model": "smollm2-135m-instruct"}, "rewards": [{"name": "correctness"}]}


def export_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"\x00weights" * 100)
    (folder / "adapter_config.json").write_text('{"r": 8}\n')
    (folder / "README.md").write_text("# card\n")
    write_export_manifest(folder, {"kind": "adapter", "source": {"job": "unit-job", "step": 4}})
    return folder


def test_manifest_accepts_the_folder_it_describes(tmp_path):
    manifest = verify_export(export_folder(tmp_path))
    assert set(manifest["files"]) == {"adapter_model.safetensors", "adapter_config.json", "README.md"}
    assert manifest["files"]["README.md"]["bytes"] == len("# card\n")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: (f / "adapter_config.json").write_text('{"r": 9}\n'), "adapter_config.json was changed"),
        (lambda f: (f / "README.md").unlink(), "README.md is missing"),
        (lambda f: (f / "extra.safetensors").write_bytes(b"x"), "extra.safetensors is not listed"),
    ],
)
def test_manifest_names_each_changed_missing_or_added_file(tmp_path, change, message):
    folder = export_folder(tmp_path)
    change(folder)
    with pytest.raises(ExportError, match=message):
        verify_export(folder)


def test_a_folder_without_manifest_is_not_an_export(tmp_path):
    with pytest.raises(ExportError, match="has no export.json"):
        verify_export(tmp_path)


def test_tree_digest_depends_on_every_file_hash():
    files = {"a": {"sha256": "1"}, "b": {"sha256": "2"}}
    assert tree_digest(files) == tree_digest(dict(reversed(list(files.items()))))
    assert tree_digest(files) != tree_digest({**files, "b": {"sha256": "3"}})


def job_folder(data_dir: Path, name: str = "unit-job") -> Path:
    job = data_dir / "jobs" / name
    job.mkdir(parents=True)
    (job / "job.yaml").write_text(yaml.safe_dump({**SPEC, "name": name}))
    for step, reward in ((2, 0.5), (4, 0.25)):
        adapter = job / "checkpoints" / f"step-{step:06d}" / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "adapter_model.safetensors").write_bytes(b"w")
        (adapter / "adapter_config.json").write_text("{}")
        (adapter.parent / "state.json").write_text(
            json.dumps({"step": step, "best_metric": "reward_mean", "metrics": {"reward_mean": reward}})
        )
    (job / "checkpoints" / ".tmp-step-000006" / "adapter").mkdir(parents=True)  # an unfinished checkpoint
    best = job / "best"
    best.mkdir()
    (best / "adapter_model.safetensors").write_bytes(b"w")
    (best / "adapter_config.json").write_text("{}")
    (best / "best.json").write_text(json.dumps({"step": 2, "value": 0.5, "metric": "reward_mean", "mode": "max"}))
    return job


@pytest.fixture
def data_dir(tmp_path):
    job_folder(tmp_path)
    return tmp_path


def test_job_by_name_or_path_and_each_selector(data_dir):
    by_name = find_job("unit-job", data_dir)
    by_path = find_job(str(data_dir / "jobs" / "unit-job"), data_dir / "elsewhere")
    assert by_name.path == by_path.path
    best = find_adapter(by_name, "best")
    assert (best.step, best.metric_name, best.metric_value) == (2, "reward_mean", 0.5)
    latest = find_adapter(by_name, "latest")
    assert latest.step == 4 and latest.folder.name == "adapter" and latest.metric_value == 0.25
    assert find_adapter(by_name, "step-2").folder.parent.name == "step-000002"
    with pytest.raises(ExportError, match=r"kept: step-2, step-4"):
        find_adapter(by_name, "step-6")  # only a .tmp- folder: never read
    with pytest.raises(ExportError, match="not one of best, latest or step-N"):
        find_adapter(by_name, "newest")


def test_unknown_job_lists_the_known_ones(data_dir):
    with pytest.raises(ExportError, match=r"no job 'nope'.*known: unit-job"):
        find_job("nope", data_dir)
