"""Which queued job gets which slots: contiguous free devices, queue order, no back-filling past a waiting job."""

from __future__ import annotations

import pytest

from appliance.service.slot_assignment import (
    Waiting,
    assign,
    contiguous_free,
    slots_wanted,
    unplaceable,
)
from appliance.service.supervisor import Slot

GPUS = [Slot(index, "cuda", f"GPU {index}", {"CUDA_VISIBLE_DEVICES": str(index + 4)}) for index in range(4)]


def _indices(found) -> list[int] | None:
    return None if found is None else [slot.index for slot in found]


def test_contiguous_free_slots_skip_a_busy_one():
    assert _indices(contiguous_free(GPUS, {1}, 2)) == [2, 3]
    assert _indices(contiguous_free(GPUS, {1}, 1)) == [0]
    assert contiguous_free(GPUS, {0, 2}, 2) is None  # two free (1 and 3) but not side by side
    assert contiguous_free(GPUS, set(), 5) is None


def test_a_waiting_two_slot_job_is_not_starved_by_one_slot_jobs_behind_it():
    """Slot 0 busy, a 2-slot job at the head: the 1-slot jobs behind it do not take the free slots."""
    queue = [Waiting("big", 2), Waiting("small-1", 1), Waiting("small-2", 1)]
    two = GPUS[:2]
    assert assign(two, {0}, queue) == []
    started = assign(two, set(), queue)
    assert [(job, _indices(slots)) for job, slots in started] == [("big", [0, 1])]
    # Once it runs, the 1-slot jobs go side by side as the slots free up.
    assert [(job, _indices(slots)) for job, slots in assign(two, set(), queue[1:])] == [
        ("small-1", [0]),
        ("small-2", [1]),
    ]


def test_jobs_start_in_queue_order_while_they_fit():
    queue = [Waiting("a", 1), Waiting("b", 2), Waiting("c", 1)]
    started = assign(GPUS, set(), queue)
    assert [(job, _indices(slots)) for job, slots in started] == [("a", [0]), ("b", [1, 2]), ("c", [3])]


def test_slots_wanted_and_what_can_never_run_here():
    assert slots_wanted({"name": "j"}) == 1 and slots_wanted({"resources": {"gpus": 3}}) == 3
    assert unplaceable({"resources": {"gpus": 2}}, 2) is None
    assert "this daemon has 2 slot(s); set resources.gpus to at most 2" in unplaceable({"resources": {"gpus": 4}}, 2)
    assert "resources.nodes: 1" in unplaceable({"resources": {"gpus": 1, "nodes": 2}}, 8)


@pytest.mark.parametrize("hostile", [{"resources": None}, {"resources": {}}])
def test_a_spec_without_resources_wants_one_slot(hostile):
    assert slots_wanted(hostile) == 1 and unplaceable(hostile, 1) is None


def test_a_worker_without_its_channel_is_refused(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "appliance.service.worker", "--data-dir", str(tmp_path), "--job-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
        timeout=60,
    )
    assert result.returncode == 2 and "required: --fd" in result.stderr


def test_a_job_wanting_more_slots_than_the_box_has_fails_instead_of_holding_up_the_queue(tmp_path):
    import os

    from appliance.metrics.training_metrics import TrainingMetrics
    from appliance.service.job_store import JobStore
    from appliance.service.supervisor import Supervisor

    metrics = TrainingMetrics(version="t", student_model="", judge_model=None)
    supervisor = Supervisor(JobStore(tmp_path / "appliance.db"), tmp_path, GPUS[:2], metrics)
    spec = {"name": "wide", "student": {"model": "m"}, "resources": {"gpus": 3}}

    def write(job_id: str) -> None:
        supervisor.job_dir(job_id).mkdir(parents=True)
        (supervisor.job_dir(job_id) / "job.yaml").write_text("name: wide\n")

    job = supervisor.store.submit("wide", os.getuid(), "u", spec, None, 1, before_commit=write)
    supervisor.tick()
    failed = supervisor.store.get(job.id).summary
    assert failed.state == "failed" and "this daemon has 2 slot(s)" in failed.reason
    assert supervisor.workers == {}


def test_the_daemon_plans_what_each_rank_holds_its_share_of_the_step(store_data_dir):
    """A 2-rank job's plan is one rank's: half the step's sequences in the rollout KV (the device: a planned GPU)."""
    import yaml
    from daemon_support import tiny_job

    from appliance.budget.device_probe import DeviceInfo
    from appliance.config.job_file import parse_job_text
    from appliance.service.submission import plan_on

    def planned(gpus: int):
        job = yaml.safe_load(tiny_job("split"))
        job["grpo"].update(prompts_per_step=16, group_size=16, max_new_tokens=512)
        job["resources"] = {"gpus": gpus}
        return plan_on(parse_job_text(yaml.safe_dump(job)), store_data_dir, DeviceInfo("cuda", 80 * 2**30, 0, "GPU"))

    whole, rank = planned(1), planned(2)
    assert rank.components["rollout_kv"] * 2 == whole.components["rollout_kv"]
    assert rank.components["student_weights"] == whole.components["student_weights"]  # DDP: a whole base each
