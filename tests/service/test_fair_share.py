"""Each user is held to a fair share: the queue orders across users, per-user caps refuse with what frees them,
finished jobs are deleted on request (owner or admin, audited) or by the retention rule, uploads leave with
their job. Other users are real uids (forked, privileges dropped), against a real daemon."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from appliance.service.api import JobSummary
from appliance.service import fair_share
from appliance.service.fair_share import fair_order
from daemon_support import (
    as_user,
    can_switch_users,
    open_socket_dir,
    tiny_job,
    unix_request,
    wait_for,
    worker_pids,
)

MEMBERS, ADMINS = 4000, 4100
ALICE, BOB, EVE = 4001, 4002, 4003
needs_root = pytest.mark.skipif(not can_switch_users(), reason="acting as other uids needs root")


def job(job_id: str, uid: int) -> JobSummary:
    return JobSummary(id=job_id, name=job_id, state="queued", uid=uid, user=str(uid), created=0, updated=0)


def test_the_queue_interleaves_users_and_passes_over_the_one_who_just_had_a_slot():
    waiting = [job(f"a{n}", 1) for n in range(5)] + [job("b0", 2), job("c0", 3), job("b1", 2)]
    order = [j.id for j in fair_order(waiting, running=[])]
    assert order[:5] == ["a0", "b0", "c0", "a1", "b1"]
    # a user holding a slot goes behind those who hold none; equals: the least recently started first
    order = [j.id for j in fair_order(waiting, running=[job("a9", 1)], last_started={1: 100.0, 2: 50.0})]
    assert order[:4] == ["c0", "b0", "b1", "a0"]
    assert [j.id for j in fair_order(waiting, [], last_started={1: 200.0})][:2] == ["b0", "c0"]


def submit_many(socket_path: str, names: list[str]) -> list[int]:
    """Submit one tiny job per name (as the calling uid); the statuses."""
    return [
        unix_request(socket_path, "POST", "/jobs", {"file_name": f"{n}.yaml", "yaml": tiny_job(n, steps=1000)})[0]
        for n in names
    ]


def member(uid: int, fn, *args):
    return as_user(uid, uid, (MEMBERS,), fn, *args)


@needs_root
def test_a_second_user_starts_while_the_first_has_300_queued(make_daemon):
    daemon = make_daemon(["--group", str(MEMBERS)])  # the default caps
    open_socket_dir(daemon, MEMBERS)
    started = time.monotonic()
    assert member(ALICE, submit_many, str(daemon.socket_path), ["a-first"]) == [201]
    client = daemon.client()
    first = wait_for(lambda: next((j for j in client.jobs() if j.state == "running"), None), 60, "a running job")
    worker = wait_for(lambda: worker_pids(daemon.data_dir), 30, "its worker")[0]
    os.killpg(os.getpgid(worker), signal.SIGSTOP)  # holds the slot without using the CPU
    statuses = member(ALICE, submit_many, str(daemon.socket_path), [f"a{n}" for n in range(300)])
    submitted = time.monotonic()
    assert statuses == [201] * 300
    assert member(BOB, submit_many, str(daemon.socket_path), ["b-first"]) == [201]
    os.killpg(os.getpgid(worker), signal.SIGCONT)
    assert unix_request(daemon.socket_path, "POST", f"/jobs/{first.id}/cancel")[0] == 200
    running = wait_for(lambda: next((j for j in client.jobs() if j.state == "running"), None), 60, "the next job")
    jobs = client.jobs()
    waiting = [j for j in jobs if j.uid == ALICE and j.state == "queued"]
    print(f"300 submissions by one user took {submitted - started:.1f} s; the other user's job started next")
    assert running.uid == BOB and running.name == "b-first"
    assert len(waiting) == 300
    daemon.stop(signal.SIGKILL)  # 300 queued jobs need no orderly shutdown (the fixture kills the workers)


@needs_root
def test_caps_refuse_with_what_frees_them_and_delete_is_the_owners_or_an_admins(make_daemon):
    daemon = make_daemon(["--group", str(MEMBERS), "--admin-group", str(ADMINS), "--max-queued-per-user", "2"])
    open_socket_dir(daemon, MEMBERS)
    socket_path = str(daemon.socket_path)
    statuses = member(ALICE, submit_many, socket_path, ["a1", "a2", "a3", "a4"])
    assert statuses[:3] == [201, 201, 201]  # one runs, two wait: the cap
    assert statuses[3] == 429
    status, answer = member(ALICE, unix_request, socket_path, "POST", "/jobs", {"file_name": "x", "yaml": tiny_job()})
    assert status == 429 and "--max-queued-per-user" in answer["error"] and "cancel or delete" in answer["error"]
    assert member(BOB, submit_many, socket_path, ["b1"]) == [201]  # another user's share is untouched
    jobs = {j.name: j for j in daemon.client().jobs()}
    target = jobs["a3"].id
    assert member(ALICE, unix_request, socket_path, "DELETE", f"/jobs/{target}")[0] == 409  # not finished
    assert member(ALICE, unix_request, socket_path, "POST", f"/jobs/{target}/cancel")[0] == 200
    assert member(EVE, unix_request, socket_path, "DELETE", f"/jobs/{target}")[0] == 403  # not hers
    status, answer = as_user(EVE, EVE, (MEMBERS, ADMINS), unix_request, socket_path, "DELETE", f"/jobs/{target}")
    assert status == 200 and answer["job_id"] == target  # an admin may
    assert not (daemon.data_dir / "jobs" / target).exists()
    assert target not in {j.id for j in daemon.client().jobs()}
    audit = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    assert any(
        a["action"] == "delete" and a["job_id"] == target and a["uid"] == EVE and a["outcome"] == "ok" for a in audit
    )
    assert any(a["action"] == "submit" and a["outcome"] == "ok" and a["job_id"] for a in audit), "no job id"
    daemon.stop(signal.SIGKILL)


def test_retention_deletes_finished_jobs_and_an_ended_jobs_upload_leaves_with_it(make_daemon, tmp_path):
    daemon = make_daemon()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{n} + 1?", "answer": str(n + 1)}) + "\n" for n in range(30)))
    spec = tiny_job("uploaded", steps=1000).replace("dataset: builtin:multiply", f"dataset: {rows}")
    spec = spec.replace("  operand_min: 2\n  operand_max: 5\n", "")
    (tmp_path / "job.yaml").write_text(spec)
    client = daemon.client()
    uploaded = client.submit(tmp_path / "job.yaml").job
    uploads = daemon.data_dir / "uploads"
    assert len(list(uploads.iterdir())) == 1
    client.cancel(uploaded.id)
    assert list(uploads.iterdir()) == [], "the ended job's upload is still there"
    daemon.stop()
    retained = make_daemon(["--retention-days", "0.00001"], data_dir=daemon.data_dir)  # about 1 s
    wait_for(lambda: not retained.client().jobs(), 30, "the retention rule to delete the finished job")
    assert not (daemon.data_dir / "jobs" / uploaded.id).exists()
    audit = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    assert any(a["action"] == "delete" and a["job_id"] == uploaded.id and "retention" in a["outcome"] for a in audit)


@needs_root
def test_finished_jobs_count_toward_a_cap_so_no_loop_grows_every_list(make_daemon):
    """A member submitted and cancelled 4 jobs a second: finished jobs are kept until deleted, every member's job
    list (and every TUI's start) holds them all, so the list grew without bound. Kept jobs are capped per user."""
    daemon = make_daemon(["--group", str(MEMBERS), "--max-jobs-per-user", "3"])
    open_socket_dir(daemon, MEMBERS)
    socket_path = str(daemon.socket_path)
    try:
        assert member(ALICE, submit_many, socket_path, ["holder"]) == [201]
        worker = wait_for(lambda: worker_pids(daemon.data_dir), 60, "the first job's worker")[0]
        os.killpg(os.getpgid(worker), signal.SIGSTOP)  # holds the slot without using the CPU
        for name in ("a2", "a3"):
            assert member(ALICE, submit_many, socket_path, [name]) == [201]
            job_id = next(j.id for j in daemon.client().jobs() if j.name == name)
            assert member(ALICE, unix_request, socket_path, "POST", f"/jobs/{job_id}/cancel")[0] == 200
        status, answer = member(
            ALICE, unix_request, socket_path, "POST", "/jobs", {"file_name": "x", "yaml": tiny_job()}
        )
        assert status == 429 and "--max-jobs-per-user" in answer["error"] and "delete finished" in answer["error"]
        assert member(BOB, submit_many, socket_path, ["b1"]) == [201]  # another user's share is untouched
        assert member(ALICE, unix_request, socket_path, "DELETE", f"/jobs/{job_id}")[0] == 200
        assert member(ALICE, submit_many, socket_path, ["a4"]) == [201]
    finally:
        daemon.stop(signal.SIGKILL)


def test_only_a_job_past_its_time_yields_and_only_to_another_users_waiting_job():
    running = [("long", 1, 0.0), ("fresh", 2, 90.0)]
    assert fair_share.overdue_holders(running, [job("w", 3)], 100.0, now=100.0) == ["long"]
    assert fair_share.overdue_holders(running, [job("w", 1)], 100.0, now=100.0) == []  # only its own user waits
    assert fair_share.overdue_holders(running, [], 100.0, now=1e9) == []  # no one waits
    assert fair_share.overdue_holders(running, [job("w", 3)], 0.0, now=1e9) == []  # 0: until it ends


@needs_root
@pytest.mark.model
def test_a_job_that_held_the_slot_past_its_time_yields_to_another_users_waiting_job(make_daemon):
    """A member's job of a million steps kept the box's one slot: the queue's order only matters when a slot
    frees, and none did. Past --max-slot-hours with another user waiting, it checkpoints and requeues."""
    daemon = make_daemon(["--group", str(MEMBERS), "--max-slot-hours", str(8 / 3600)])
    open_socket_dir(daemon, MEMBERS)
    socket_path = str(daemon.socket_path)
    assert member(ALICE, submit_many, socket_path, ["long"]) == [201]
    client = daemon.client()
    long = wait_for(lambda: next((j for j in client.jobs() if j.state == "running"), None), 60, "the long job")
    daemon.wait_step(long.id, 1)  # past its time by now: it yields once another user waits
    assert member(BOB, submit_many, socket_path, ["waiting"]) == [201]
    bobs = wait_for(
        lambda: next((j for j in client.jobs() if j.name == "waiting" and j.state == "running"), None),
        300,
        "the other user's job to get the slot",
    )
    requeued = client.job(long.id)
    assert requeued.state == "queued" and "yielded its slot" in requeued.reason, requeued.reason
    assert requeued.checkpoints, "it yielded without a checkpoint"
    assert bobs.uid == BOB
