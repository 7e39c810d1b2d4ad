"""A judge at an endpoint holds no memory on this device: the plan has no judge weights, KV or phase."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from appliance.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gsm8k-qwen7b-gpu.yaml"


def plan_json(path: Path, capsys) -> dict:
    assert main(["plan", str(path), "--device-memory", "80GiB", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_remote_judge_is_not_planned(tmp_path, capsys):
    local = yaml.safe_load(EXAMPLE.read_text())
    remote = json.loads(json.dumps(local))
    remote["judge"].update(endpoint="http://judge.lab:8000/v1", model="Qwen/Qwen3-8B")
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(local))
    (tmp_path / "remote.yaml").write_text(yaml.safe_dump(remote))
    with_local = plan_json(tmp_path / "local.yaml", capsys)
    with_remote = plan_json(tmp_path / "remote.yaml", capsys)
    # The same job with its judge on this device plans gigabytes for it; at an endpoint, nothing.
    assert with_local["components"]["judge_weights"] > 10 * 2**30
    assert with_remote["components"]["judge_weights"] == 0 and with_remote["components"]["judge_kv"] == 0
    assert "judge" not in with_remote["phases"]
    assert with_remote["engines"]["judge"] == "remote"
    assert main(["plan", str(tmp_path / "remote.yaml"), "--device-memory", "80GiB"]) == 0
    assert "judge at a remote endpoint (no memory on this device)" in capsys.readouterr().out
