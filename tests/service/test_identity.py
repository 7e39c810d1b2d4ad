"""Identity holds in the container: with the daemon in its own PID namespace (the shipped container's case,
SO_PEERCRED's pid is 0), a caller's supplementary groups still come from the connection (SO_PEERGROUPS, read
when it was made), so an admin in a supplementary group acts on another user's job and others are refused."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess

import pytest

from daemon_support import as_user, can_switch_users, open_socket_dir, tiny_job, unix_request, wait_for

MEMBERS, ADMINS = 4000, 4100
ALICE, BOB, EVE = 4001, 4002, 4003


def unshare_works() -> bool:
    if not can_switch_users() or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-p", "-f", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not unshare_works(), reason="needs root and unshare -p (a PID namespace)")
def test_an_admin_in_a_supplementary_group_cancels_another_users_job_across_a_pid_namespace(make_daemon):
    daemon = make_daemon(
        ["--group", str(MEMBERS), "--admin-group", str(ADMINS)], prefix=["unshare", "-p", "-f", "--kill-child"]
    )
    open_socket_dir(daemon, MEMBERS)
    socket_path = str(daemon.socket_path)
    status, answer = as_user(
        ALICE,
        ALICE,
        (MEMBERS,),
        unix_request,
        socket_path,
        "POST",
        "/jobs",
        {"file_name": "a.yaml", "yaml": tiny_job()},
    )
    assert status == 201, answer
    job_id = answer["job"]["id"]
    # Eve is a member, not an admin: refused. Bob has the admin group only as a supplementary group.
    status, answer = as_user(EVE, EVE, (MEMBERS,), unix_request, socket_path, "POST", f"/jobs/{job_id}/cancel")
    assert status == 403 and "admin group" in answer["error"]
    status, answer = as_user(BOB, BOB, (MEMBERS, ADMINS), unix_request, socket_path, "POST", f"/jobs/{job_id}/cancel")
    assert status == 200 and answer["state"] == "cancelled", answer
    audit = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    cancel = [line for line in audit if line["action"] == "cancel" and line["outcome"] == "ok"]
    assert cancel and cancel[0]["uid"] == BOB and cancel[0]["job_id"] == job_id
    assert cancel[0]["pid"] == 0, "the daemon saw the caller's pid: it is not in its own PID namespace"
    wait_for(lambda: daemon.client().job(job_id).state == "cancelled", 30, "the job to be cancelled")
    daemon.stop(signal.SIGKILL)  # unshare --kill-child takes the daemon with it
