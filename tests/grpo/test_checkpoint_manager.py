"""CheckpointManager and RunRecords without a model: retention, the best/ swap, crashes, a full disk, rewinds."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections import namedtuple

import pytest

from appliance.errors import DiskFullError
from appliance.grpo.checkpoint import PAYLOAD, CheckpointManager, remove_tree
from appliance.grpo.records import RunRecords


def payload(size: int = 1000):
    def write(folder):
        for name in PAYLOAD:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(b"x" * size)

    return write


def _steps(manager: CheckpointManager) -> list[int]:
    return [info.step for info in manager.complete()]


def test_retention_keeps_the_newest_and_leaves_no_staging_or_deleted_folders(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        manager.save(step, payload(), {"data_cursor": step})
    assert _steps(manager) == [3, 4]
    assert sorted(p.name for p in manager.root.iterdir()) == ["step-000003", "step-000004"]
    assert manager.latest().state["data_cursor"] == 4 and manager.missing_files(manager.latest()) == []


def test_a_crash_while_writing_leaves_the_previous_checkpoint_complete(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save(1, payload(), {})

    def crashing(folder):
        payload()(folder)
        raise KeyboardInterrupt  # the process dies half-way (before state.json)

    with pytest.raises(KeyboardInterrupt):
        manager.save(2, crashing, {})
    assert _steps(manager) == [1]  # the staging folder has no step- name: never read
    manager.save(3, payload(), {})
    assert _steps(manager) == [1, 3] and not list(manager.root.glob(".tmp-*"))


def test_a_crash_during_retention_never_leaves_a_half_deleted_checkpoint_under_its_name(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, payload(), {})
    victim = manager.root / "step-000001"
    os.replace(victim, victim.with_name(".del-step-000001"))  # killed right after the rename
    (victim.with_name(".del-step-000001") / "optimizer.pt").unlink()  # ... and during the delete
    assert _steps(manager) == []
    manager.save(2, payload(), {})
    assert sorted(p.name for p in manager.root.iterdir()) == ["step-000002"]


def test_a_damaged_state_file_is_skipped_and_missing_payload_is_reported(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save(1, payload(), {})
    manager.save(2, payload(), {})
    (manager.root / "step-000002" / "state.json").write_text("{torn")
    assert manager.latest().step == 1
    (manager.root / "step-000001" / "rng.pt").write_bytes(b"")
    assert manager.missing_files(manager.latest()) == ["rng.pt"]


def test_best_is_a_symlink_flipped_atomically_and_never_missing(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step, value in ((1, 0.2), (4, 0.5)):
        manager.update_best(
            lambda folder, s=step: (folder / "adapter_model.safetensors").write_text(f"v{s}"),
            {"step": step, "value": value, "metric": "reward_mean"},
        )
        assert manager.best_dir.is_symlink()
        assert (manager.best_dir / "adapter_model.safetensors").read_text() == f"v{step}"
    assert manager.best_state() == {"step": 4, "value": 0.5, "metric": "reward_mean"}
    assert [p.name for p in manager.best_versions.iterdir()] == ["step-000004"]  # the old version is gone
    assert not os.path.isabs(os.readlink(manager.best_dir))  # relative: the job folder can move


def test_resume_reconciles_a_dangling_best_from_the_checkpoint_state(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    write = payload()
    manager.save(
        2,
        lambda folder: (write(folder), (folder / "adapter" / "adapter_model.safetensors").write_text("adapter at 2")),
        {"best": {"step": 2, "value": 0.7}},
    )
    manager.update_best(
        lambda folder: (folder / "adapter_model.safetensors").write_text("later"), {"step": 3, "value": 0.9}
    )
    shutil.rmtree(manager.best_versions)  # best/ now dangles
    state = manager.reconcile_best(manager.latest())
    assert state == {"step": 2, "value": 0.7}
    assert (manager.best_dir / "adapter_model.safetensors").read_text() == "adapter at 2"
    manager.update_best(
        lambda folder: (folder / "adapter_model.safetensors").write_text("v5"), {"step": 5, "value": 1.0}
    )
    assert manager.reconcile_best(manager.latest()) == {"step": 5, "value": 1.0}  # a readable best/ is kept


Usage = namedtuple("Usage", "total used free")


def test_too_little_free_space_is_refused_before_writing_naming_folder_and_bytes(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save(1, payload(4000), {})
    # The disk is the hardware boundary: it reports 1 KB free.
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1024, 1024))
    with pytest.raises(DiskFullError) as caught:
        manager.save(2, payload(4000), {})
    message = str(caught.value)
    assert str(manager.root) in message and "1,024 bytes are free" in message and "needs about" in message
    assert _steps(manager) == [1] and not list(manager.root.glob(".tmp-*"))


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4160 vs 4054"),
    ],
)
def test_a_write_that_fails_for_space_becomes_disk_full_and_keeps_the_last_checkpoint(tmp_path, failure):
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save(1, payload(), {})

    def failing(folder):
        payload()(folder)
        raise failure

    with pytest.raises(DiskFullError, match="not enough disk space to write a checkpoint"):
        manager.save(2, failing, {})
    assert _steps(manager) == [1] and manager.missing_files(manager.latest()) == []
    with pytest.raises(RuntimeError, match="something else"):  # other failures are not disguised
        manager.save(3, lambda folder: (_ for _ in ()).throw(RuntimeError("something else")), {})


def test_records_rewind_every_table_and_survive_a_torn_last_line(tmp_path):
    records = RunRecords(tmp_path)
    for step in (1, 2, 3):
        records.metrics({"step": step, "reward_mean": step / 10})
        records.samples([{"step": step, "completion": "x"}])
    (tmp_path / "judge.jsonl").write_text("".join(json.dumps({"step": s, "score": 1}) + "\n" for s in (1, 2, 3)))
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 4, "rew')  # killed mid-line
    records.rewind_to(2)
    for table in ("metrics.jsonl", "samples.jsonl", "judge.jsonl"):
        assert [json.loads(line)["step"] for line in (tmp_path / table).read_text().splitlines()] == [1, 2]


def test_samples_rotate_past_their_limit(tmp_path):
    records = RunRecords(tmp_path, samples_limit_bytes=200)
    for step in range(1, 20):
        records.samples([{"step": step, "completion": "y" * 40}])
    assert (tmp_path / "samples.jsonl.1").is_file()
    assert (tmp_path / "samples.jsonl").stat().st_size < 400


def test_remove_tree_renames_before_deleting(tmp_path):
    folder = tmp_path / "step-000001"
    (folder / "adapter").mkdir(parents=True)
    remove_tree(folder)
    assert not folder.exists() and not (tmp_path / ".del-step-000001").exists()
