"""Per-job ownership against a real daemon: other uids of the socket's group may list and view a job, only its
owner, root and the --admin-group may act on it (callers switched with setpriv; needs root)."""

from __future__ import annotations

import json


from caller_support import ADMIN, NEEDS_SETPRIV, OTHER, OWNER, as_uid, submitted

pytestmark = NEEDS_SETPRIV


def test_only_the_owner_root_and_admins_act_on_a_job(ownership_daemon):
    daemon = ownership_daemon
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
