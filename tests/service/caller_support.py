"""Callers of a real daemon as other uids (setpriv; needs root): an owner, a stranger and an admin, all in the
socket's group, and a daemon that lets that group in with an admin group beside it."""

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

NEEDS_SETPRIV = pytest.mark.skipif(
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


def start_shared_daemon(make_daemon):
    """A daemon whose socket USERS may use, with ADMINS as its --admin-group."""
    server = make_daemon(["--group", USERS, "--admin-group", ADMINS], start=False)
    gid_of(USERS), gid_of(ADMINS)
    os.chmod(server.socket_path.parent, 0o755)
    return server.start()
