"""No caller's successful changes rotate the audit history away: pause, resume, cancel, delete, export and the
endpoint are written in full, so each caller may make them only at a bounded rate (service/call_rate.py).

The attack it answers: a member paused and resumed her own queued job in a loop, 250 fsynced audit lines a
second, every one "ok", and the 96 MiB history was gone in under an hour (and the job store grew an event per
call). Against a real daemon, with the member a real uid (forked, privileges dropped)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from appliance.service.call_rate import CallRate, TooManyCalls
from daemon_support import as_user, can_switch_users, open_socket_dir, tiny_job, unix_request, wait_for, worker_pids

MEMBERS, ALICE, BOB = 4200, 4201, 4202
needs_root = pytest.mark.skipif(not can_switch_users(), reason="acting as other uids needs root")


def test_a_bucket_lets_a_burst_through_then_one_call_a_second():
    now = [0.0]
    rate = CallRate(burst=5, per_second=1.0, clock=lambda: now[0])
    for _ in range(5):
        rate.charge(("uid", 1))
    with pytest.raises(TooManyCalls, match="retry in 1 s"):
        rate.charge(("uid", 1))
    rate.charge(("uid", 2))  # another caller has its own bucket
    now[0] = 2.5
    rate.charge(("uid", 1))
    rate.charge(("uid", 1))
    with pytest.raises(TooManyCalls):
        rate.charge(("uid", 1))


def submit(socket_path: str, name: str) -> str:
    status, answer = unix_request(socket_path, "POST", "/jobs", {"file_name": "j.yaml", "yaml": tiny_job(name, 1000)})
    assert status == 201, answer
    return answer["job"]["id"]


def flip(socket_path: str, job_id: str, times: int) -> list[int]:
    """Pause and resume `job_id` `times` times each, as fast as the daemon answers; the statuses."""
    return [
        unix_request(socket_path, "POST", f"/jobs/{job_id}/{action}")[0]
        for _ in range(times)
        for action in ("pause", "resume")
    ]


def pauses(socket_path: str, job_id: str, times: int) -> list[tuple[int, dict]]:
    return [unix_request(socket_path, "POST", f"/jobs/{job_id}/pause") for _ in range(times)]


@needs_root
def test_a_pause_resume_loop_is_held_to_the_rate_and_another_member_is_not(make_daemon):
    daemon = make_daemon(["--group", str(MEMBERS)])
    open_socket_dir(daemon, MEMBERS)
    socket_path = str(daemon.socket_path)
    as_alice = lambda fn, *args: as_user(ALICE, ALICE, (MEMBERS,), fn, *args)  # noqa: E731
    try:
        as_alice(submit, socket_path, "holder")
        worker = wait_for(lambda: worker_pids(daemon.data_dir), 60, "the first job's worker")[0]
        os.killpg(os.getpgid(worker), signal.SIGSTOP)  # holds the only slot without using the CPU
        target = as_alice(submit, socket_path, "flipped")
        bob_job = as_user(BOB, BOB, (MEMBERS,), submit, socket_path, "bobs")
        started = time.monotonic()
        statuses = as_alice(flip, socket_path, target, 250)
        seconds = time.monotonic() - started
        ok, refused = statuses.count(200), statuses.count(429)
        assert ok <= 300 + seconds + 1 and refused >= 500 - (300 + seconds + 1), (ok, refused, seconds)
        started = time.monotonic()
        burst = as_alice(pauses, socket_path, target, 10)  # right after the loop: at most one a second more
        let_through = [answer for status, answer in burst if status != 429]
        assert len(let_through) <= time.monotonic() - started + 1, burst
        assert any(status == 429 and "retry in" in answer["error"] for status, answer in burst), burst
        status, _ = as_user(BOB, BOB, (MEMBERS,), unix_request, socket_path, "POST", f"/jobs/{bob_job}/cancel")
        assert status == 200  # another member's own bucket is full
        audit = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
        alices = [line for line in audit if line["uid"] == ALICE and line["action"] in ("pause", "resume")]
        assert len(alices) <= ok + 20, "refusals past the rate written in full"
        print(f"{ok} changes in {seconds:.1f} s let through, {refused} refused; {len(alices)} audit lines")
    finally:
        daemon.stop(signal.SIGKILL)  # a stopped worker cannot checkpoint: no orderly shutdown
