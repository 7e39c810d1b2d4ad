"""A 2-rank job (resources: {gpus: 2} as 2 gloo CPU processes) through `appliance train`: trains, checkpoints,
survives kill -9 of one rank and resumes to an uninterrupted run's records (the base sharded with FSDP in one,
whole on each rank in the other); 2 "nodes" on loopback complete."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from daemon_support import forked_ranks
from tiny_model import tiny_job

pytestmark = pytest.mark.model

STEPS = 4


def _train(job_file: Path, data_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "appliance", "train", str(job_file), "--data-dir", str(data_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    return output


def _by_step(path: Path) -> dict[int, list[dict]]:
    rows: dict[int, list[dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], []).append(row)
    return rows


def _kill_rank_1_after_checkpoint(job_file: Path, data_dir: Path, step: int) -> None:
    """Start the job, kill -9 its rank 1 once step `step`'s checkpoint is complete; the launcher ends the rest."""
    victim = _train(job_file, data_dir)
    marker = data_dir / "jobs" / "tiny" / "checkpoints" / f"step-{step:06d}" / "state.json"
    deadline = time.monotonic() + 240
    while not marker.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), f"no step-{step} checkpoint appeared"
    ranks = forked_ranks(victim.pid)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGKILL)
    output, _ = victim.communicate(timeout=120)
    assert victim.returncode != 0 and "--resume" in output
    assert forked_ranks(victim.pid) == {}  # the launcher ended the other rank too


@pytest.fixture
def job_file(tiny_model_dir, tmp_path) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    return tiny_job(
        tiny_model_dir,
        folder,
        grpo={"steps": STEPS, "prompts_per_step": 2, "micro_batch_size": 4},
        resources={"gpus": 2},
    )


def test_two_ranks_train_checkpoint_and_resume_after_kill_9_of_one_rank(job_file, tmp_path):
    """The uninterrupted run holds the whole base on each rank (DDP). The interrupted run shards it over the
    ranks (FSDP), loses rank 1 to kill -9 after step 2's checkpoint and resumes: same seeds, so the same
    records, samples and held-out eval as the uninterrupted DDP run; only where the base's weights live differs."""
    spec = yaml.safe_load(job_file.read_text())
    spec["checkpoint"]["eval_every"] = STEPS  # the eval generates on the gathered weights under FSDP
    spec["student"]["gradient_checkpointing"] = True  # recomputed layers gather their shard again
    job_file.write_text(yaml.safe_dump(spec))
    sharded_file = job_file.with_name("sharded.yaml")
    sharded_file.write_text(yaml.safe_dump({**spec, "resources": {"gpus": 2, "sharding": "fsdp"}}))
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    output = _finish(_train(job_file, straight))
    assert "starting 2 rank(s)" in output and output.count(f"step    {STEPS}/{STEPS}") == 1
    job_dir = straight / "jobs" / "tiny"
    checkpoint = job_dir / "checkpoints" / "step-000002"
    assert json.loads((checkpoint / "world.json").read_text()) == {"world_size": 2}
    assert (checkpoint / "rng-rank0.pt").is_file() and (checkpoint / "rng-rank1.pt").is_file()
    records = _by_step(job_dir / "metrics.jsonl")
    assert sorted(records) == list(range(1, STEPS + 1)) and all(len(rows) == 1 for rows in records.values())
    assert records[1][0]["completions"] == 8  # both ranks' groups in one record (4 per rank)

    _kill_rank_1_after_checkpoint(sharded_file, interrupted, step=2)
    _finish(_train(sharded_file, interrupted, "--resume"))
    log = (interrupted / "jobs" / "tiny" / "log.txt").read_text()
    assert "sharded over 2 ranks with FSDP" in log and "resumed 'tiny' at step 2" in log
    assert "FSDP" not in (job_dir / "log.txt").read_text()
    got = _by_step(interrupted / "jobs" / "tiny" / "metrics.jsonl")
    assert sorted(got) == list(range(1, STEPS + 1)) and all(len(rows) == 1 for rows in got.values())
    for step in range(1, STEPS + 1):
        for key in ("reward_mean", "reward_std", "completions", "trained_tokens", "completion_length_mean"):
            assert got[step][0][key] == records[step][0][key], (step, key)
        assert got[step][0]["loss"] == pytest.approx(records[step][0]["loss"], abs=1e-6)
    assert got[STEPS][0]["eval"] == records[STEPS][0]["eval"]
    assert records[STEPS][0]["eval"]["problems"] == 8  # each rank evaluated 4 of the 8 held-out problems, merged
    samples = _by_step(interrupted / "jobs" / "tiny" / "samples.jsonl")
    expected = _by_step(job_dir / "samples.jsonl")
    assert [r["completion"] for r in samples[STEPS]] == [r["completion"] for r in expected[STEPS]]


def test_resuming_a_two_rank_checkpoint_with_one_rank_is_refused(job_file, tmp_path):
    data_dir = tmp_path / "data"
    spec = yaml.safe_load(job_file.read_text())
    spec["grpo"]["steps"] = 2
    job_file.write_text(yaml.safe_dump(spec))
    _finish(_train(job_file, data_dir))
    # A hostile edit: the job file and its frozen copy both say one rank now.
    spec["resources"]["gpus"] = 1
    job_file.write_text(yaml.safe_dump(spec))
    frozen = data_dir / "jobs" / "tiny" / "job.yaml"
    saved = yaml.safe_load(frozen.read_text())
    saved["resources"]["gpus"] = 1
    frozen.write_text(yaml.safe_dump(saved))
    process = _train(job_file, data_dir, "--resume")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "written by 2 data-parallel rank(s) and this run has 1" in output


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_nodes_on_loopback_complete(tiny_model_dir, tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    job_file = tiny_job(tiny_model_dir, folder, grpo={"steps": 2}, resources={"gpus": 1, "nodes": 2})
    endpoint = f"127.0.0.1:{_free_port()}"
    data_dir = tmp_path / "data"  # shared by both "boxes", as a lab's shared file system would be
    flags = ["--nnodes", "2", "--rdzv-endpoint", endpoint]
    nodes = [_train(job_file, data_dir, *flags, "--node-rank", str(rank)) for rank in (0, 1)]
    outputs = [_finish(node) for node in nodes]
    assert "(node 0 of 2)" in outputs[0] and "(node 1 of 2)" in outputs[1]
    records = _by_step(data_dir / "jobs" / "tiny" / "metrics.jsonl")
    assert sorted(records) == [1, 2] and records[1][0]["completions"] == 8
    assert json.loads((data_dir / "jobs" / "tiny" / "checkpoints" / "step-000002" / "world.json").read_text()) == {
        "world_size": 2
    }


def test_a_node_rank_outside_the_job_is_refused(tiny_model_dir, tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    job_file = tiny_job(tiny_model_dir, folder, resources={"gpus": 1, "nodes": 2})
    process = _train(job_file, tmp_path / "data", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2 and "--node-rank 2 is outside 0..1" in output
    process = _train(job_file, tmp_path / "data", "--nnodes", "3", "--node-rank", "0", "--rdzv-endpoint", "x:1")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2 and "resources.nodes is 2" in output


def test_what_auto_resolves_to_is_held_to_config_checks_rules_when_the_ranks_start(tiny_model_dir, tmp_path):
    """tensor_parallel_size with rollout: auto passes config check (auto is vLLM on CUDA); on this CPU box auto is
    transformers, which would ignore it, so the ranks refuse it in its sentence before loading a model."""
    folder = tmp_path / "job"
    folder.mkdir()
    job_file = tiny_job(
        tiny_model_dir,
        folder,
        engine={"rollout": "auto", "vllm": {"tensor_parallel_size": 2}},
        resources={"gpus": 2},
    )
    process = _train(job_file, tmp_path / "data")
    output, _ = process.communicate(timeout=120)
    last = [line for line in output.splitlines() if line.startswith("error:")][-1]  # the launcher's
    assert process.returncode == 2 and "--resume" not in last, output[-2000:]  # nothing a resume would mend
    assert "engine.vllm.tensor_parallel_size: tensor_parallel_size splits vLLM's copy" in output, output[-2000:]
    assert not (tmp_path / "data" / "jobs" / "tiny" / "metrics.jsonl").exists()


def test_a_sharded_job_judged_by_the_students_base_counts_every_ranks_judging(tiny_model_dir, tmp_path):
    """FSDP with a judge sharing the student's base (gathered whole for the rollout and the judging) and one
    held-out problem over two ranks (rank 1's share is empty): the step's judge outcomes are both ranks' and the
    evaluation is of the one problem."""
    folder = tmp_path / "job"
    folder.mkdir()
    job_file = tiny_job(
        tiny_model_dir,
        folder,
        judge={"model": str(tiny_model_dir), "share_student_base": True, "min_score_mass": 1e-6},
        rewards=[{"name": "rewards.py:text_length", "weight": 1.0}, {"name": "judge", "weight": 0.5}],
        task={"held_out": 1},
        grpo={"steps": 1, "prompts_per_step": 2, "micro_batch_size": 4},
        checkpoint={"eval_every": 1},
        resources={"gpus": 2, "sharding": "fsdp"},
    )
    _finish(_train(job_file, tmp_path / "data"))
    [record] = _by_step(tmp_path / "data" / "jobs" / "tiny" / "metrics.jsonl")[1]
    assert record["completions"] == 8 and record["judge_outcomes"]["ok"] == 8, record["judge_outcomes"]
    assert record["eval"]["problems"] == 1
