"""Tracker sinks: the tiny job ran with TensorBoard and W&B on and outbound connections refused.

Each sink's files are read back with that tool's own reader: TensorBoard's
event accumulator, and for W&B the offline run folder that `wandb sync`
uploads (its `.wandb` transaction log, records parsed with wandb's protobuf
schema). A missing package is one log line, never a crash.
"""

from __future__ import annotations

import builtins
import json
import struct
import sys

import pytest

from appliance.config.schema import JobSpec
from appliance.grpo.step_record import StepRecord
from appliance.trackers import flatten_record, open_trackers

STEP_KEYS = ("reward_mean", "rewards/correctness/mean", "seconds/train", "memory/peak_rss_bytes")


def metrics_lines(trained_job) -> list[dict]:
    return [json.loads(line) for line in (trained_job.job_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.model
def test_run_opened_no_outbound_connection(trained_job):
    assert trained_job.outbound_attempts == []
    log = (trained_job.job_dir / "log.txt").read_text()
    assert "tracking.tensorboard: writing to" in log and "tracking.wandb: writing to" in log


@pytest.mark.model
def test_tensorboard_event_file_reads_back_with_tensorboards_reader(trained_job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = trained_job.job_dir / "tensorboard"
    assert list(folder.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()["tensors"]
    record = metrics_lines(trained_job)[-1]
    for key in STEP_KEYS:
        assert key in tags
    [reward] = events.Tensors("reward_mean")
    assert reward.step == record["step"] == 1
    assert float(reward.tensor_proto.float_val[0]) == pytest.approx(record["reward_mean"], rel=1e-6)


def wandb_records(path):
    """Records of a `.wandb` transaction log: LevelDB-log framing (32 KiB blocks, 7-byte headers) of protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"  # the file's own header (magic, version)
    position, block, pending = 7, 32768, b""
    records = []
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # the rest of a block too small for a header is padding
            position += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += room
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.mark.model
def test_wandb_offline_run_folder_holds_the_steps(trained_job):
    runs = list((trained_job.job_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    [log] = list(runs[0].glob("run-*.wandb"))
    records = wandb_records(log)
    kinds = [record.WhichOneof("record_type") for record in records]
    assert "run" in kinds and "history" in kinds and "exit" in kinds
    run = next(record.run for record in records if record.WhichOneof("record_type") == "run")
    assert run.project == "lab-tests" and run.display_name == "lab-tiny"
    history = [record.history for record in records if record.WhichOneof("record_type") == "history"]
    values = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in history[0].item}
    record = metrics_lines(trained_job)[-1]
    assert values["_step"] == record["step"]
    assert values["reward_mean"] == pytest.approx(record["reward_mean"])
    assert values["rewards/correctness/mean"] == pytest.approx(record["rewards"]["correctness"]["mean"])


def test_flatten_names_nested_scalars_and_drops_text():
    flat = flatten_record(
        {
            "step": 3,
            "job": "x",
            "reward_mean": 0.5,
            "nonfinite": False,
            "rewards": {"correctness": {"mean": 1.0, "std": 0.0}},
            "eval": None,
            "seconds": {"train": 2},
            "loss": float("nan"),
        }
    )
    assert flat == {
        "reward_mean": 0.5,
        "nonfinite": 0.0,
        "rewards/correctness/mean": 1.0,
        "rewards/correctness/std": 0.0,
        "seconds/train": 2.0,
    }


def test_missing_packages_give_one_clear_line_and_no_sink(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def without_trackers(name, *args, **kwargs):
        if name.split(".")[0] in ("wandb", "tensorboard"):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name.split(".")[0])
        return real_import(name, *args, **kwargs)

    for module in [m for m in sys.modules if m.startswith(("appliance.trackers.", "wandb", "tensorboard"))]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(builtins, "__import__", without_trackers)
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "student": {"model": "m"},
            "rewards": [{"name": "correctness"}],
            "tracking": {"tensorboard": True, "wandb": True},
        }
    )
    lines: list[str] = []
    trackers = open_trackers(spec, tmp_path, lines.append)
    assert trackers.sinks == []
    assert len(lines) == 2
    assert "tracking.tensorboard is on but the tensorboard package is not installed" in lines[0]
    assert "tracking.wandb is on but the wandb package is not installed" in lines[1]
    assert all("pip install 'appliance[trackers]'" in line for line in lines)
    record = StepRecord.from_dict(
        {
            "step": 1,
            "time": 0.0,
            "reward_mean": 0.0,
            "reward_std": 0.0,
            "loss": 0.0,
            "kl": 0.0,
            "clip_ratio": 0.0,
            "grad_norm": 0.0,
            "learning_rate": 0.0,
            "groups_informative": 0,
            "groups_total": 0,
            "trained_sequences": 0,
            "trained_tokens": 0,
            "micro_batch_size": 1,
            "completions": 0,
            "completion_length_mean": 0.0,
            "completion_length_max": 0,
        }
    )
    trackers.write(record)  # no sink, no error
    trackers.close()


def test_tracking_is_off_by_default(tmp_path):
    spec = JobSpec.model_validate({"name": "t", "student": {"model": "m"}, "rewards": [{"name": "correctness"}]})
    lines: list[str] = []
    assert open_trackers(spec, tmp_path, lines.append).sinks == [] and lines == []
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "wandb").exists()
