"""The supervisor on a box of two slots (fake only at the device list: two CPU slots): a 2-rank job holds both,
1-rank jobs queued behind it wait and then run side by side; kill -9 of one rank restarts the job as a whole;
pause stops every rank after the same step; cancel ends every rank. Workers and ranks are real processes training the bundled model with gloo."""

from __future__ import annotations

import os
import signal
import time

import pytest
import yaml
from daemon_support import forked_ranks, link_model_store, tiny_job, worker_pids
from prometheus_client import generate_latest

from appliance.metrics.training_metrics import TrainingMetrics
from appliance.service.job_store import JobStore
from appliance.service.supervisor import Slot, Supervisor

pytestmark = pytest.mark.model

TWO_SLOTS = [Slot(0, "cpu", "fake device 0"), Slot(1, "cpu", "fake device 1")]


@pytest.fixture
def supervisor(tmp_path, store_data_dir):
    data_dir = link_model_store(store_data_dir, tmp_path / "data")
    metrics = TrainingMetrics(version="t", student_model="", judge_model=None)
    started = Supervisor(
        JobStore(data_dir / "appliance.db"), data_dir, TWO_SLOTS, metrics, max_restarts=2, backoff_seconds=(0.0,)
    )
    started.start()
    yield started
    started.shutdown(timeout=5)
    assert worker_pids(data_dir) == []


def _submit(supervisor: Supervisor, name: str, steps: int, gpus: int = 1) -> str:
    spec = yaml.safe_load(tiny_job(name, steps=steps))
    spec["grpo"]["prompts_per_step"] = gpus  # one group per rank
    spec["resources"] = {"gpus": gpus}
    spec["checkpoint"]["every"] = 1

    def write(job_id: str) -> None:
        folder = supervisor.job_dir(job_id)
        folder.mkdir(parents=True)
        (folder / "job.yaml").write_text(yaml.safe_dump(spec))

    job = supervisor.store.submit(name, os.getuid(), "u", spec, None, steps, before_commit=write)
    supervisor.wake()
    return job.id


def _until(predicate, timeout: float = 240.0, what: str = ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _state(supervisor: Supervisor, job_id: str) -> str:
    return supervisor.store.get(job_id).summary.state


def _holders(supervisor: Supervisor) -> list[str | None]:
    return [slot.job_id for slot in supervisor.device_status().slots]


def _stepped(supervisor: Supervisor, job_id: str, step: int) -> bool:
    return (supervisor.store.get(job_id).summary.step or 0) >= step


def test_a_two_rank_job_waits_for_both_slots_then_one_rank_jobs_share_them(supervisor):
    first = _submit(supervisor, "first", steps=2)
    wide = _submit(supervisor, "wide", steps=2, gpus=2)
    left, right = _submit(supervisor, "left", steps=1), _submit(supervisor, "right", steps=1)
    _until(lambda: _stepped(supervisor, first, 1), what="the first job's step 1")
    # Slot 1 is free, but the 2-rank job ahead in the queue waits for it: nothing back-fills it.
    assert _holders(supervisor) == [first, None]
    assert [_state(supervisor, job) for job in (wide, left, right)] == ["queued"] * 3

    _until(lambda: _holders(supervisor) == [wide, wide], what="the 2-rank job on both slots")
    _until(lambda: _stepped(supervisor, wide, 1), what="the 2-rank job's step 1")
    step = supervisor.store.events(job_id=wide, kinds=("step",))[0].data
    assert step["completions"] == 4  # both ranks' groups (2 prompts x 2) in the job's one record
    # The job's tokens (and tokens/s) are every rank's: each rank generated only its own 2 completions.
    assert step["generated_tokens"]["student"] == round(step["completion_length_mean"] * 4)
    scraped = generate_latest(supervisor.metrics.registry).decode()
    assert 'device="0-1"' in scraped  # the job's series name every device its ranks hold
    _until(lambda: _state(supervisor, wide) == "succeeded", what="the 2-rank job to finish")

    _until(lambda: sorted(filter(None, _holders(supervisor))) == sorted([left, right]), what="both 1-rank jobs")
    for job in (left, right):
        _until(lambda job=job: _state(supervisor, job) == "succeeded", what=f"{job} to finish")
    assert _holders(supervisor) == [None, None]


def test_kill_9_of_one_rank_restarts_the_job_pause_stops_every_rank_and_cancel_ends_them(supervisor):
    job = _submit(supervisor, "wide", steps=50, gpus=2)
    _until(lambda: _stepped(supervisor, job, 1), what="step 1")
    leader = supervisor._worker_of(job).proc  # the worker, the ranks' launcher (ranks.launch_ranks)
    ranks = forked_ranks(leader.pid)
    assert sorted(ranks) == [0, 1] and {os.getpgid(pid) for pid in ranks.values()} == {leader.pid}
    os.kill(ranks[1], signal.SIGKILL)  # one process group: the daemon's kill reaches every rank
    _until(lambda: leader.poll() is not None, timeout=60, what="the launcher to end rank 0 with rank 1")
    assert not _alive(ranks[0])
    _until(lambda: supervisor.store.get(job).summary.attempts == 2, timeout=30, what="the restart")
    assert "restarted on slots 0-1" in supervisor.store.get(job).summary.reason
    restarted = supervisor._worker_of(job)
    _until(lambda: supervisor.store.get(job).summary.step >= 2, what="a step after the restart")

    # Pause reaches rank 0 only; both ranks stop after the same step and its checkpoint is written once.
    supervisor.pause(job)
    _until(lambda: _state(supervisor, job) == "paused", what="the pause")
    assert restarted.proc.returncode == 0  # the launcher ends 0 only when every rank did
    paused = supervisor.store.get(job).summary
    checkpoint = supervisor.job_dir(job) / "checkpoints" / f"step-{paused.step:06d}"
    assert f"paused after step {paused.step}" in paused.reason and (checkpoint / "rng-rank1.pt").is_file()
    supervisor.resume(job)
    _until(lambda: supervisor.store.get(job).summary.step > paused.step, what="a step after the resume")

    launcher = supervisor._worker_of(job).proc.pid
    pids = {launcher, *forked_ranks(launcher).values()}
    supervisor.cancel(job)
    assert _state(supervisor, job) == "cancelled"
    assert all(not _alive(pid) for pid in pids)
    assert _holders(supervisor) == [None, None]


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
