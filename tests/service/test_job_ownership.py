"""Per-job ownership against a real daemon: other uids of the socket's group may list and view a job, only its
owner, root and the --admin-group may act on it (callers switched with setpriv; needs root)."""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import sys

import pytest

from daemon_support import tiny_job

USERS, ADMINS = "apl-own-users", "apl-own-admins"
OWNER, OTHER, ADMIN = 4242, 4243, 4244
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="switching uids needs root and setpriv"
)

CALL = """
import http.client, json, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
conn = Unix("x", timeout=60)
body = sys.argv[4] if len(sys.argv) > 4 else None
conn.request(sys.argv[2], sys.argv[3], body=body, headers={"Content-Type": "application/json"})
answer = conn.getresponse()
print(json.dumps({"status": answer.status, "body": json.loads(answer.read() or b"null")}))
"""


def gid_of(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", name], check=True)
        return grp.getgrnam(name).gr_gid


def as_uid(daemon, uid: int, method: str, path: str, payload: dict | None = None, admin: bool = False) -> tuple:
    groups = ["--groups", str(gid_of(ADMINS))] if admin else ["--clear-groups"]
    command = ["setpriv", "--reuid", str(uid), "--regid", str(gid_of(USERS)), *groups, PYTHON, "-c", CALL]
    command += [str(daemon.socket_path), method, path] + ([json.dumps(payload)] if payload is not None else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    return answer["status"], answer["body"]


def submitted(daemon, uid: int, name: str) -> str:
    payload = {"yaml": tiny_job(name=name, steps=1000), "file_name": f"{name}.yaml", "uploads": {}}
    status, body = as_uid(daemon, uid, "POST", "/jobs", payload)
    assert status == 201, body
    assert body["job"]["uid"] == uid
    return body["job"]["id"]


@pytest.fixture
def daemon(make_daemon):
    server = make_daemon(["--group", USERS, "--admin-group", ADMINS], start=False)
    gid_of(USERS), gid_of(ADMINS)
    os.chmod(server.socket_path.parent, 0o755)
    return server.start()


def test_only_the_owner_root_and_admins_act_on_a_job(daemon):
    first = submitted(daemon, OWNER, "first")
    status, body = as_uid(daemon, OTHER, "GET", "/jobs")
    assert status == 200 and [job["id"] for job in body["jobs"]] == [first]
    assert as_uid(daemon, OTHER, "GET", f"/jobs/{first}")[0] == 200
    for method, path, payload in [
        ("POST", f"/jobs/{first}/cancel", None),
        ("POST", f"/jobs/{first}/pause", None),
        ("POST", f"/jobs/{first}/export", {"name": "stolen"}),
        ("DELETE", f"/jobs/{first}/export", None),
        ("GET", f"/jobs/{first}/endpoint", None),
    ]:
        status, body = as_uid(daemon, OTHER, method, path, payload)
        assert status == 403, (path, body)
        assert "belongs to" in body["error"]
    for uid, admin in [(OWNER, False), (ADMIN, True)]:  # past the ownership check, to the job's own refusal
        status, body = as_uid(daemon, uid, "GET", f"/jobs/{first}/endpoint", admin=admin)
        assert status == 400 and "does not take external rollouts" in body["error"], body
        status, body = as_uid(daemon, uid, "DELETE", f"/jobs/{first}/export", admin=admin)
        assert status == 200 and body == {"job_id": first, "cancelled": False}, body
    assert as_uid(daemon, OWNER, "POST", f"/jobs/{first}/cancel")[0] == 200
    second = submitted(daemon, OWNER, "second")
    assert as_uid(daemon, ADMIN, "POST", f"/jobs/{second}/cancel", admin=True)[0] == 200
    third = submitted(daemon, OWNER, "third")
    assert daemon.client().cancel(third).state in ("cancelled", "cancelling")  # root
    audit = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    denied = [line for line in audit if line["uid"] == OTHER and "belongs to" in line["outcome"]]
    assert {line["action"] for line in denied} == {"cancel", "pause", "export", "cancel_export", "endpoint"}
