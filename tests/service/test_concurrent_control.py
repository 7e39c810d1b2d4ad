"""Job control fired concurrently at one job by its owner, another user and an admin (a real daemon; callers switched
with setpriv, so these need root): non-owners only ever get 403/404, nothing answers 5xx, and afterwards the job's
state, its worker, its folder, the exports folder and the audit log agree with the answers that were given."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from daemon_support import tiny_job, unix_request, wait_for, worker_pids
from caller_support import ADMIN, NEEDS_SETPRIV, OTHER, OWNER, as_uid, submitted

pytestmark = NEEDS_SETPRIV


CALLERS = {"owner": (OWNER, False), "other": (OTHER, False), "admin": (ADMIN, True)}
# (method, path under /jobs/<id>, body, the action its audit line names)
ACTIONS = [
    ("POST", "/pause", None, "pause"),
    ("POST", "/resume", None, "resume"),
    ("POST", "/cancel", None, "cancel"),
    ("DELETE", "", None, "delete"),
    ("POST", "/export", {"name": "raced"}, "export"),
    ("DELETE", "/export", None, "cancel_export"),
]


def fire(daemon, calls: list[tuple]) -> list[tuple]:
    """(who, action, status, body) of each (who, method, path, body, action) call, all started at once."""

    def one(call):
        who, method, path, payload, action = call
        uid, admin = CALLERS[who]
        status, body = as_uid(daemon, uid, method, path, payload, admin=admin)
        return who, action, status, body

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(one, calls))


def audit_lines(daemon) -> list[dict]:
    return [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]


def running_with_worker(daemon, job_id: str) -> bool:
    return daemon.client().job(job_id).state == "running" and bool(worker_pids(daemon.data_dir))


def state_chain_holds(events) -> bool:
    """Each state event starts where the one before it ended (no transition lost or applied twice)."""
    states = [(event.data["from"], event.data["to"]) for event in events if event.kind == "state"]
    return all(before[1] == after[0] for before, after in zip(states, states[1:]))


def test_every_action_at_once_from_three_users(ownership_daemon):
    """Owner, a stranger and an admin each fire pause, resume, cancel, delete, export and export-cancel twice at a
    starting job, all at once: the stranger gets only 403/404, nobody a 5xx, the one cancel that ended the job is
    answered 200 (a delete right after it once turned that answer into a 404, audited as refused), every 2xx has
    its one "ok" audit line, and the job ends deleted, or cancelled with no worker left, with no export staging
    folder left behind."""
    daemon = ownership_daemon
    job = submitted(daemon, OWNER, "storm")
    wait_for(lambda: running_with_worker(daemon, job), 60, "the job's worker to start")
    calls = [
        (who, method, f"/jobs/{job}{tail}", body, action) for who in CALLERS for method, tail, body, action in ACTIONS
    ]
    results = fire(daemon, calls * 2)

    assert [result for result in results if result[2] >= 500] == []
    assert {status for who, _, status, _ in results if who == "other"} <= {403, 404}, results
    assert not any(who != "other" and status == 403 for who, _, status, _ in results), results
    # Only a cancel ends this job: exactly one says so, even when a delete removes the job right after it.
    assert [action for _, action, status, _ in results if action == "cancel" and status == 200] == ["cancel"], results
    deleted = [who for who, action, status, _ in results if action == "delete" and status == 200]
    assert len(deleted) <= 1, results
    if deleted:
        assert unix_request(daemon.socket_path, "GET", f"/jobs/{job}")[0] == 404
        assert not (daemon.data_dir / "jobs" / job).exists()
    else:
        assert daemon.client().job(job).state == "cancelled"
    wait_for(lambda: not worker_pids(daemon.data_dir), 30, "the cancelled job's worker to be gone")
    exports = daemon.data_dir / "exports"
    assert not exports.is_dir() or list(exports.iterdir()) == [], list(exports.iterdir())

    ok = Counter((line["uid"], line["action"]) for line in audit_lines(daemon) if line["outcome"] == "ok")
    answered = Counter((CALLERS[who][0], action) for who, action, status, _ in results if 200 <= status < 300)
    assert {key: n for key, n in ok.items() if key[1] != "submit"} == answered
    assert "Traceback" not in daemon.log()


def test_forged_job_ids_reach_no_job(ownership_daemon):
    """Aliases of a real job's id (case, whitespace, a newline, NUL, a trailing slash, path tricks, one digit more or
    less) are a 400 or 404 even for root, at once from several threads, never an action on the job; the id spelled
    with percent-escapes of its own characters is the job itself, so a stranger gets 403."""
    daemon = ownership_daemon
    job = submitted(daemon, OWNER, "forged")
    aliases = [
        job.upper(),
        f"%20{job}",
        f"{job}%20",
        f"{job}%0A",
        f"{job}%0D%0A",
        f"{job}%09",
        f"{job}%00",
        f"{job}%2F",
        f"{job}/",
        f"..%2F{job}",
        f"{job}0",
        job[:-1],
        "%EF%BC%90" + job[1:],  # a fullwidth zero
    ]
    calls = [
        (method, f"/jobs/{alias}{tail}", body) for alias in aliases if alias != job for method, tail, body, _ in ACTIONS
    ]
    calls += [(method, f"/jobs/{job}{tail}/", body) for method, tail, body, _ in ACTIONS]  # a trailing slash
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda call: (*call, unix_request(daemon.socket_path, *call)[0]), calls))
    assert [call for call in statuses if call[-1] not in (400, 404)] == [], job
    escaped = "".join(f"%{ord(char):02x}" for char in job)
    assert as_uid(daemon, OTHER, "POST", f"/jobs/{escaped}/cancel")[0] == 403
    detail = daemon.client().job(job)
    assert detail.state in ("queued", "running"), detail.state
    assert [event.data["to"] for event in detail.events if event.kind == "state"] == ["queued", "running"][
        : len(detail.events)
    ]
    daemon.client().cancel(job)  # a worker killed now, not one checkpointing at the daemon's stop


def test_pause_resume_flips_while_the_slot_frees(ownership_daemon):
    """The owner and an admin flip pause/resume on a waiting job while the job ahead of it is cancelled: the job
    ends paused with no worker, or running with one; each state event starts where the last one ended."""
    daemon = ownership_daemon
    first = submitted(daemon, OWNER, "ahead")
    second = submitted(daemon, OWNER, "flipped")
    wait_for(lambda: running_with_worker(daemon, first), 60, "the first job's worker to start")
    flips = []
    for _ in range(4):
        for who in ("owner", "admin"):
            flips += [(who, "POST", f"/jobs/{second}/pause", None, "pause")]
            flips += [(who, "POST", f"/jobs/{second}/resume", None, "resume")]
    flips.insert(len(flips) // 2, ("owner", "POST", f"/jobs/{first}/cancel", None, "cancel"))
    results = fire(daemon, flips)
    assert all(status in (200, 409) for _, _, status, _ in results), results
    time.sleep(2.0)  # two supervisor ticks: a queued job on the free slot has started

    detail = daemon.client().job(second)
    assert detail.state in ("paused", "running"), detail.state
    if detail.state == "running":
        holder = daemon.client().device().slots[0].job_id
        assert holder == second and worker_pids(daemon.data_dir)
    else:
        wait_for(lambda: not worker_pids(daemon.data_dir), 30, "no worker for a paused job")
    assert state_chain_holds(detail.events), [event.data for event in detail.events]
    assert daemon.client().job(first).state == "cancelled"
    daemon.client().cancel(second)


@pytest.mark.model
def test_a_cancelled_export_leaves_nothing_and_two_deletes_free_once(ownership_daemon):
    """A merged export cancelled by an admin while it writes leaves no staging folder in <data-dir>/exports (its
    process is killed, so the daemon removes it); then the owner and the admin delete the job at once: one 200,
    one 404, the job's folder gone, and one "ok" delete in the audit log."""
    daemon = ownership_daemon
    payload = {"yaml": tiny_job(name="exported", steps=1), "file_name": "exported.yaml", "uploads": {}}
    status, body = as_uid(daemon, OWNER, "POST", "/jobs", payload)
    assert status == 201, body
    job = body["job"]["id"]
    daemon.wait_state(job, "succeeded", timeout=300)
    answer = {}
    request = {"name": "merged", "merged": True, "dtype": "float32"}
    exporting = threading.Thread(
        target=lambda: answer.update(export=as_uid(daemon, OWNER, "POST", f"/jobs/{job}/export", request))
    )
    exporting.start()
    exports = daemon.data_dir / "exports"
    wait_for(lambda: exports.is_dir() and any(exports.iterdir()), 120, "the export's staging folder")
    results = fire(
        daemon,
        [
            ("other", "DELETE", f"/jobs/{job}/export", None, "cancel_export"),
            ("admin", "DELETE", f"/jobs/{job}/export", None, "cancel_export"),
        ],
    )
    assert [status for _, _, status, _ in results] == [403, 200], results
    assert results[1][3]["cancelled"] is True
    exporting.join(120)
    assert answer["export"][0] == 409, answer
    assert list(exports.iterdir()) == []

    deletes = fire(
        daemon,
        [("owner", "DELETE", f"/jobs/{job}", None, "delete")] * 2
        + [("admin", "DELETE", f"/jobs/{job}", None, "delete")],
    )
    assert sorted(status for _, _, status, _ in deletes) == [200, 404, 404], deletes
    assert not (daemon.data_dir / "jobs" / job).exists()
    assert unix_request(daemon.socket_path, "POST", f"/jobs/{job}/resume")[0] == 404
    ok_deletes = [line for line in audit_lines(daemon) if line["action"] == "delete" and line["outcome"] == "ok"]
    assert len(ok_deletes) == 1 and ok_deletes[0]["job_id"] == job


def test_concurrent_submissions_of_one_user_keep_to_the_job_cap(make_daemon):
    """A user at --max-jobs-per-user 1 who sends submissions from four threads, each retrying as soon as it is
    answered, stores one job: the cap is checked with the insert, not only before the admission's check (two
    submissions both passed that check before either was stored)."""
    daemon = make_daemon(["--max-jobs-per-user", "1"])
    payload = {"yaml": tiny_job(name="capped", steps=1000), "file_name": "capped.yaml", "uploads": {}}
    answers: list[tuple[int, dict]] = []

    def submit_until_capped():
        for _ in range(20):  # bounded: an answer that is never the cap's fails the test instead of hanging it
            status, body = unix_request(daemon.socket_path, "POST", "/jobs", payload)
            answers.append((status, body))
            if status != 201 and "keeps" in body.get("error", ""):
                return

    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(submit_until_capped) for _ in range(4)]:
            done.result(timeout=120)
    jobs = unix_request(daemon.socket_path, "GET", "/jobs")[1]["jobs"]
    for job in jobs:  # killed now, not checkpointing at the daemon's stop
        unix_request(daemon.socket_path, "POST", f"/jobs/{job['id']}/cancel")
    assert len(jobs) == 1, jobs
    assert [status for status, _ in answers].count(201) == 1
    assert {status for status, _ in answers} == {201, 429}, answers
