"""Real jobs under a real daemon (the bundled model, a few tiny steps), driven with the real client.

The module's `served_job` daemon ran one job end to end while `jobs logs
--follow`, 200 concurrent status requests and a real Prometheus watched it;
later tests in the module reuse that daemon for the worker kill, pause/resume
and cancel. The daemon-restart tests start their own.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import pytest

from appliance.service.job_store import JobStore
from daemon_support import group_alive, prometheus_query, tiny_job, wait_for, worker_pids
from service_latency import percentile

pytestmark = pytest.mark.model

# DESIGN.md "Prometheus metric names": what a scrape must hold (histograms as their _count series).
DESIGN_METRICS = [
    "appliance_generated_tokens_total",
    "appliance_prompt_tokens_total",
    "appliance_completions_total",
    "appliance_train_steps_total",
    "appliance_step_duration_seconds_count",
    "appliance_generation_tokens_per_second",
    "appliance_reward_mean",
    "appliance_reward_std",
    "appliance_kl",
    "appliance_loss",
    "appliance_clip_ratio",
    "appliance_memory_planned_bytes",
    "appliance_memory_used_bytes",
    "appliance_memory_budget_bytes",
    "appliance_device_memory_total_bytes",
    "appliance_device_memory_used_bytes",
    "appliance_judge_requests_total",
    # appliance_eval_accuracy: only once a job evaluated (the tiny job does not; test_dashboard's does)
    "appliance_nonfinite_steps_total",
    "appliance_worker_restarts_total",
    "appliance_jobs",
    "appliance_disk_free_bytes",
    "appliance_build_info",
]


def steps_of(job_dir) -> list[int]:
    metrics = job_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return [json.loads(line)["step"] for line in lines if line.strip()]


def submit(daemon, tmp_path, name: str, steps: int) -> str:
    job_file = tmp_path / f"{name}.yaml"
    job_file.write_text(tiny_job(name, steps=steps))
    result = daemon.cli("submit", str(job_file), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["job"]["id"]


# ----- one job from submit to success ----------------------------------------------------------------


def test_submit_runs_to_success_through_appliance_jobs(served_job):
    daemon, job_id = served_job.daemon, served_job.job_id
    shown = daemon.cli("show", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert job["state"] == "succeeded" and job["step"] == 3
    assert [(e["data"]["from"], e["data"]["to"]) for e in job["events"]] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "succeeded"),
    ]
    job_dir = daemon.data_dir / "jobs" / job_id
    assert steps_of(job_dir) == [1, 2, 3]
    assert (job_dir / "best").is_dir() and any((job_dir / "best").iterdir())
    assert [c["step"] for c in job["checkpoints"]] == [2, 3]  # keep_last: 2
    assert all((job_dir / "checkpoints" / f"step-{s:06d}" / "state.json").is_file() for s in (2, 3))
    listed = daemon.cli("list")
    assert listed.returncode == 0 and job_id in listed.stdout and "succeeded" in listed.stdout
    metrics = daemon.cli("metrics", job_id, "--json")
    assert [record["step"] for record in json.loads(metrics.stdout)] == [1, 2, 3]


def test_export_through_the_control_api(served_job):
    """POST /jobs/{id}/export writes <data-dir>/exports/<name>/ (never a caller's path) and is audited."""
    from appliance.export import verify_export
    from appliance.service.client import Client, ClientError

    daemon, job_id = served_job.daemon, served_job.job_id
    with Client(daemon.socket_path, timeout=60) as client:
        exported = client.export(job_id, "served-best")
        with pytest.raises(ClientError, match="already exists and is not empty") as refused:
            client.export(job_id, "served-best")
        with pytest.raises(ClientError) as traversal:
            client._request("POST", f"/jobs/{job_id}/export", json={"name": "../outside"})
    assert refused.value.status == 400 and traversal.value.status == 422
    assert exported.path == str((daemon.data_dir / "exports" / "served-best").resolve())
    manifest = verify_export(exported.path)
    assert exported.kind == "adapter" and manifest["source"]["job"] == "served"
    assert manifest["source"]["step"] == exported.step and exported.job_id == job_id
    assert not (daemon.data_dir / "outside").exists()
    audit = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    exports = [line for line in audit if line["action"] == "export"]
    assert [line["outcome"].split(":")[0] for line in exports] == ["ok", "refused"]


def test_jobs_samples_prints_what_the_worker_recorded_and_agent_trajectories(served_job):
    daemon, job_id = served_job.daemon, served_job.job_id
    path = daemon.data_dir / "jobs" / job_id / "samples.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    newest = [record for record in records if record["step"] == max(r["step"] for r in records)]
    shown = daemon.cli("samples", job_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == (
        f"== step {newest[0]['step']} · prompt 1: {newest[0]['question']}  (answer {newest[0]['reference']})"
    )
    assert all(
        record["completion"].strip().splitlines()[0] in shown.stdout
        for record in newest
        if record["completion"].strip()
    )
    first = daemon.cli("samples", job_id, "--step", "1", "--json")
    assert json.loads(first.stdout) == [record for record in records if record["step"] == 1]
    # An agent job's line (the trainer's shape) served by the daemon prints with its turns and mask.
    trajectory = {
        "step": 99,
        "kind": "trajectory",
        "environment": "calculator",
        "scenario": "7 * 8",
        "reward": 1.0,
        "rewards": {"correct": 1.0},
        "advantage": 0.5,
        "metrics": {"turns": 2},
        "messages": [
            {"role": "user", "content": "What is 7 * 8?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 7, "b": 8}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "56"},
            {"role": "assistant", "content": "<answer>56</answer>"},
        ],
        "segments": [
            {"text": "<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\n", "trained": False},
            {"text": '<tool_call>{"name": "multiply", "arguments": {"a": 7, "b": 8}}</tool_call>', "trained": True},
            {"text": "\n<|im_start|>tool\n56<|im_end|>\n<|im_start|>assistant\n", "trained": False},
            {"text": "<answer>56</answer><|im_end|>", "trained": True},
        ],
        "trained_tokens": 30,
        "context_tokens": 25,
    }
    original = path.read_text()
    try:
        path.write_text(original + json.dumps(trajectory) + "\n")
        agent = daemon.cli("samples", job_id)
    finally:
        path.write_text(original)
    assert agent.returncode == 0, agent.stderr
    lines = agent.stdout.splitlines()
    assert lines[:2] == [
        "== step 99 · group 1 · calculator · scenario 7 * 8 · 1 trajectory",
        "-- trajectory 1: reward 1.00  correct 1.00  advantage +0.50  tokens: 30 trained, 25 context",
    ]
    assert '   assistant      call multiply({"a": 7, "b": 8})' in lines
    assert "   tool (multiply)56" not in lines and "   tool (multiply) 56" in lines
    assert [line for line in lines if line.startswith("   TRAIN |")] == [
        '   TRAIN | <tool_call>{"name": "multiply", "arguments": {"a": 7, "b": 8}}</tool_call>',
        "   TRAIN | <answer>56</answer><|im_end|>",
    ]


def test_logs_follow_streams_lines_as_they_are_written(served_job):
    lines = served_job.follow_lines
    log_text = (served_job.daemon.data_dir / "jobs" / served_job.job_id / "log.txt").read_text()
    assert "".join(line for _, line in lines) == log_text
    # Streamed, not dumped at the end: lines arrived while the job still ran.
    assert lines[0][0] < served_job.finished_at - 1.0
    assert sum(1 for at, _ in lines if at < served_job.finished_at) >= 2


def test_200_concurrent_status_requests_while_a_job_trains(served_job):
    latencies, errors = served_job.status_latencies, served_job.status_errors
    assert errors == [] and len(latencies) == 200
    p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    print(
        f"\n200 concurrent GET /status while training: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )
    assert p99 < 10.0


def test_a_real_prometheus_scrapes_every_design_metric(served_job):
    base = served_job.prometheus
    # A finished job's own gauges are removed when its worker ends: look over the whole run, not at "now".
    with urllib.request.urlopen(f"{base}/api/v1/label/__name__/values", timeout=10) as response:
        present = {name for name in json.loads(response.read())["data"] if name.startswith("appliance_")}
    missing = [name for name in DESIGN_METRICS if name not in present]
    assert missing == [], f"missing from Prometheus: {missing}"

    def value(query: str) -> float:
        result = prometheus_query(base, query)
        assert result, query
        return float(result[0]["value"][1])

    assert value('appliance_generated_tokens_total{role="student"}') > 0
    assert value('appliance_prompt_tokens_total{role="student"}') > 0
    assert value("appliance_completions_total") == 3 * 2  # steps x group_size
    assert value("appliance_train_steps_total") == 3
    assert value('appliance_jobs{state="succeeded"}') == 1
    assert value("appliance_disk_free_bytes") > 0
    assert value("sum(max_over_time(appliance_memory_planned_bytes[10m]))") > 0
    assert "appliance_eval_accuracy" not in present  # absent, not 0, while no job has evaluated
    assert prometheus_query(base, "appliance_reward_mean") == []  # removed with the job's worker
    build = prometheus_query(base, "appliance_build_info")[0]["metric"]
    assert build["student_model"] == "smollm2-135m-instruct"


# ----- failures and operator actions on the same daemon -----------------------------------------------


def test_kill_9_of_the_worker_resumes_from_its_checkpoint(served_job, tmp_path):
    daemon = served_job.daemon
    job_id = submit(daemon, tmp_path, "killed", steps=4)
    daemon.wait_step(job_id, 2)
    [pid] = worker_pids(daemon.data_dir)
    pgid = os.getpgid(pid)
    assert pgid == pid  # the worker leads its own process group
    os.kill(pid, signal.SIGKILL)
    job = daemon.wait_state(job_id, "succeeded")
    assert steps_of(daemon.data_dir / "jobs" / job_id) == [1, 2, 3, 4]  # no step recorded twice
    reasons = [e.data["reason"] for e in daemon.client().job(job_id).events]
    assert any("SIGKILL" in reason and "restart 1/3" in reason for reason in reasons), reasons
    assert not group_alive(pgid)
    assert job.attempts == 2


def test_pause_frees_the_device_and_resume_continues_at_the_next_step(served_job, tmp_path):
    daemon = served_job.daemon
    client = daemon.client()
    job_id = submit(daemon, tmp_path, "paused", steps=4)
    daemon.wait_step(job_id, 1)
    client.pause(job_id)
    paused = daemon.wait_state(job_id, "paused", timeout=120)
    assert worker_pids(daemon.data_dir) == []
    assert client.device().slots[0].job_id is None
    at = paused.step
    assert 1 <= at < 4 and steps_of(daemon.data_dir / "jobs" / job_id) == list(range(1, at + 1))
    cursor = client.events().cursor
    client.resume(job_id)
    daemon.wait_state(job_id, "succeeded")
    resumed_steps = [e.step for e in client.events(after=cursor, job_id=job_id).events if e.kind == "step"]
    assert resumed_steps == list(range(at + 1, 5))
    assert steps_of(daemon.data_dir / "jobs" / job_id) == [1, 2, 3, 4]


def test_cancel_ends_a_running_job_within_seconds(served_job, tmp_path):
    daemon = served_job.daemon
    client = daemon.client()
    job_id = submit(daemon, tmp_path, "cancelled", steps=50)
    daemon.wait_state(job_id, "running")
    wait_for(lambda: worker_pids(daemon.data_dir), 30, "the worker")
    began = time.monotonic()
    job = client.cancel(job_id)
    elapsed = time.monotonic() - began
    assert job.state == "cancelled" and elapsed < 5.0
    assert worker_pids(daemon.data_dir) == []


# ----- the daemon itself dies or is stopped ----------------------------------------------------------


def test_kill_9_of_the_daemon_then_a_restart_finishes_all_three_jobs(make_daemon, tmp_path):
    daemon = make_daemon()
    jobs = [submit(daemon, tmp_path, f"crash{index}", steps=2 if index == 0 else 1) for index in range(3)]
    daemon.wait_step(jobs[0], 1)
    states = {job.id: job.state for job in daemon.client().jobs()}
    assert [states[job] for job in jobs] == ["running", "queued", "queued"]
    daemon.stop(signal.SIGKILL)
    # The orphaned worker sees its channel close and stops on its own; a restart kills what is left.
    daemon.start()
    for job_id, steps in zip(jobs, ([1, 2], [1], [1])):
        daemon.wait_state(job_id, "succeeded")
        assert steps_of(daemon.data_dir / "jobs" / job_id) == steps


def test_sigterm_interrupts_the_job_with_a_checkpoint_and_a_restart_resumes_it(make_daemon, tmp_path):
    daemon = make_daemon()
    job_id = submit(daemon, tmp_path, "stopped", steps=4)
    daemon.wait_step(job_id, 1)
    began = time.monotonic()
    assert daemon.stop(signal.SIGTERM, timeout=90) == 0
    print(f"\nSIGTERM to exit: {time.monotonic() - began:.1f} s")
    assert worker_pids(daemon.data_dir) == []
    store = JobStore(daemon.data_dir / "appliance.db")
    try:
        job = store.get(job_id).summary
    finally:
        store.close()
    assert job.state == "interrupted", job.reason
    checkpoint = daemon.data_dir / "jobs" / job_id / "checkpoints" / f"step-{job.step:06d}"
    assert (checkpoint / "state.json").is_file() and (checkpoint / "adapter").is_dir()
    assert steps_of(daemon.data_dir / "jobs" / job_id) == list(range(1, job.step + 1))
    daemon.start()
    daemon.wait_state(job_id, "succeeded")
    assert steps_of(daemon.data_dir / "jobs" / job_id) == [1, 2, 3, 4]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_checkpoint_that_would_fill_the_disk_pauses_the_job_and_resume_finishes_it(make_daemon, tmp_path):
    import subprocess

    daemon = make_daemon()
    jobs = daemon.data_dir / "jobs"
    # 2 MiB holds the job's files but not one checkpoint (adapter + optimizer state are over 3 MiB).
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(jobs)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        job_id = submit(daemon, tmp_path, "diskfull", steps=2)
        job = daemon.wait_state(job_id, "paused")
        assert "not enough disk space to write a checkpoint" in job.reason and str(jobs / job_id) in job.reason
        assert worker_pids(daemon.data_dir) == []
        # Nothing half-written or lost: every checkpoint folder is complete, and the steps recorded are
        # exactly those checkpointed (the step whose checkpoint did not fit runs again after resume).
        done = sorted(int(folder.name[5:]) for folder in (jobs / job_id / "checkpoints").glob("step-*"))
        assert all((jobs / job_id / "checkpoints" / f"step-{step:06d}" / "state.json").is_file() for step in done)
        assert steps_of(jobs / job_id) == done and len(done) < 2
        subprocess.run(["mount", "-o", "remount,size=256m", str(jobs)], check=True)
        daemon.client().resume(job_id)
        daemon.wait_state(job_id, "succeeded")
        assert steps_of(jobs / job_id) == [1, 2]
    finally:
        daemon.close()
        subprocess.run(["umount", "-l", str(jobs)], capture_output=True)
