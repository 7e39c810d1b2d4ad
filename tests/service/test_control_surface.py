"""The daemon's control surface without training: socket permissions, SO_PEERCRED, audit, no TCP control
port, a uid outside the group, sd_notify, and 30 malformed submissions that store nothing.

These start real `appliance serve` processes and drive them with the real
client; no model is loaded (submissions are validated and planned only).
"""

from __future__ import annotations

import grp
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from appliance.service.client import Client, ClientError
from daemon_support import REPO_ROOT, tiny_job

SETPRIV = "/usr/bin/setpriv"
SYSTEM_PYTHON = "/usr/bin/python3"
NOBODY = 65534


def raw_get(socket_path: Path, path: str) -> tuple[int, dict]:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://x") as client:
        response = client.get(path)
        return response.status_code, response.json()


def test_socket_is_0660_with_its_group_from_its_first_appearance(make_daemon):
    group = grp.getgrnam("users")
    daemon = make_daemon(["--group", "users"], start=False)
    seen: list[os.stat_result] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                seen.append(os.lstat(daemon.socket_path))
            except FileNotFoundError:
                continue

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        daemon.start()
    finally:
        stop.set()
        watcher.join()
    assert seen, "the socket never appeared"
    modes = {(stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), s.st_gid) for s in seen}
    assert modes == {(stat.S_IFSOCK, 0o660, group.gr_gid)}
    # No staging folder is left next to it.
    assert sorted(p.name for p in daemon.socket_path.parent.iterdir()) == ["control.sock"]


def test_audit_lines_carry_the_callers_uid_and_pid(make_daemon, tmp_path):
    daemon = make_daemon()
    job_file = tmp_path / "tiny.yaml"
    job_file.write_text(tiny_job())
    command = [sys.executable, "-m", "appliance", "jobs"]
    calls = [["submit", str(job_file), "--dry-run"], ["cancel", "0123456789"], ["pause", "abcdefabcd"]]
    pids = []
    for call in calls:
        proc = subprocess.Popen(
            command + call + ["--socket", str(daemon.socket_path)],
            env=daemon.env,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        pids.append(proc.pid)
        proc.communicate(timeout=60)
    lines = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    assert [(line["action"], line["pid"], line["uid"]) for line in lines] == [
        ("submit", pids[0], os.getuid()),  # "received", written before any check
        ("dry_run", pids[0], os.getuid()),
        ("cancel", pids[1], os.getuid()),
        ("pause", pids[2], os.getuid()),
    ]
    assert lines[0]["outcome"].startswith("received (") and lines[1]["outcome"] == "ok"
    assert lines[2]["outcome"].startswith("refused: no job '0123456789'")
    assert lines[2]["job_id"] == "0123456789"
    # GETs are not audited; the status call answered with the caller's uid.
    with Client(daemon.socket_path) as client:
        assert client.status().caller_uid == os.getuid()
    assert len((daemon.data_dir / "audit.jsonl").read_text().splitlines()) == 4


def _listening_tcp_ports(pid: int) -> list[tuple[str, int]]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                address, port = local.split(":")
                ports.append((address, int(port, 16)))
    return ports


def test_no_tcp_control_port_only_the_loopback_metrics_port(make_daemon):
    daemon = make_daemon()
    assert _listening_tcp_ports(daemon.proc.pid) == [("0100007F", daemon.metrics_port)]  # 127.0.0.1
    with httpx.Client() as client:  # and that port serves metrics, not the API
        assert client.get(f"http://127.0.0.1:{daemon.metrics_port}/jobs").text.startswith("# HELP")


def _as_nobody(socket_path: Path, groups: list[int]) -> subprocess.CompletedProcess:
    """A raw HTTP GET /status through the socket, run as uid 65534 with only `groups`."""
    program = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1])\n"
        "except PermissionError:\n print('EACCES'); sys.exit(3)\n"
        "s.sendall(b'GET /status HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n')\n"
        "data=b''\n"
        "while chunk:=s.recv(65536): data+=chunk\n"
        "print(data.decode().split('\\r\\n\\r\\n',1)[1])\n"
    )
    group_args = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    return subprocess.run(
        [
            SETPRIV,
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            *group_args,
            SYSTEM_PYTHON,
            "-c",
            program,
            str(socket_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SETPRIV), reason="needs root and setpriv to switch uid")
def test_a_caller_outside_the_group_is_refused_by_the_filesystem(make_daemon):
    users = grp.getgrnam("users").gr_gid
    daemon = make_daemon(["--group", "users"], start=False)
    os.chmod(daemon.socket_path.parent, 0o755)  # the folder is open; the socket's mode decides
    daemon.start()
    outside = _as_nobody(daemon.socket_path, [])
    assert outside.returncode == 3 and outside.stdout.strip() == "EACCES", outside
    inside = _as_nobody(daemon.socket_path, [users])
    assert inside.returncode == 0, inside.stderr
    assert json.loads(inside.stdout)["caller_uid"] == NOBODY


def test_a_request_without_peer_credentials_is_refused(tmp_path):
    import asyncio

    from appliance.service.control import create_app
    from appliance.service.daemon import Daemon, DaemonOptions

    daemon = Daemon(DaemonOptions(data_dir=tmp_path / "data"))
    try:

        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=create_app(daemon))  # an ASGI scope with no SO_PEERCRED reading
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
                return await client.get("/status")

        response = asyncio.run(call())
    finally:
        daemon.close()
    assert response.status_code == 403
    assert "credentials could not be read" in response.json()["error"]


def test_notify_socket_gets_ready_watchdog_and_stopping(make_daemon, tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = Path(f"/tmp/apl-notify-{os.getpid()}-{time.monotonic_ns()}")
    listener.bind(str(path))
    listener.settimeout(30)
    try:
        daemon = make_daemon(env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"})
        messages = []
        while messages.count("WATCHDOG=1") < 2:
            messages.append(listener.recv(4096).decode())
        assert messages[0] == "READY=1", messages
        assert daemon.stop(signal.SIGTERM, timeout=60) == 0
        while "STOPPING=1" not in messages:
            messages.append(listener.recv(4096).decode())
    finally:
        listener.close()
        path.unlink(missing_ok=True)


# ----- 30 malformed submissions -------------------------------------------------------------------

GOOD = tiny_job("malformed")


def _replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


ROWS_OK = '{"question": "What is 2 * 3?", "answer": "6"}\n' * 4


def malformed_cases(plugins_dir: Path) -> list[tuple[str, dict, int]]:
    """(what, SubmitRequest fields, expected status)."""
    dataset = "  dataset: builtin:multiply\n  operand_min: 2\n  operand_max: 5\n  held_out: 4\n"
    with_file = _replace(dataset, "  dataset: data/train.jsonl\n  held_out: 1\n")
    return [
        ("bad YAML", {"yaml": "name: x\nstudent: [unclosed\n"}, 422),
        ("a list instead of a mapping", {"yaml": "- a\n- b\n"}, 422),
        ("an empty file", {"yaml": ""}, 422),
        ("an unknown top-level key", {"yaml": GOOD + "colour: blue\n"}, 422),
        ("an unknown nested key", {"yaml": _replace("  steps: 3", "  stepz: 3")}, 422),
        ("a missing model", {"yaml": _replace("model: smollm2-135m-instruct", "model: no-such-model")}, 422),
        (
            "a model folder that does not exist",
            {"yaml": _replace("model: smollm2-135m-instruct", "model: /nowhere/m")},
            422,
        ),
        ("no student section", {"yaml": "name: x\nrewards:\n  - {name: correctness}\n"}, 422),
        ("a wrong type", {"yaml": _replace("  steps: 3", "  steps: many")}, 422),
        ("a negative group size", {"yaml": _replace("group_size: 2", "group_size: -2")}, 422),
        ("an unknown reward", {"yaml": _replace("name: correctness", "name: corectness")}, 422),
        ("the judge reward without a judge", {"yaml": _replace("name: correctness", "name: judge")}, 422),
        ("a key given twice", {"yaml": GOOD + "name: again\n"}, 422),
        ("an unknown built-in dataset", {"yaml": _replace("builtin:multiply", "builtin:mulitply")}, 422),
        (
            "a plugin outside the plugin dir (absolute)",
            {"yaml": _replace("name: correctness", "name: /tmp/evil.py:reward")},
            422,
        ),
        (
            "a plugin escaping the plugin dir",
            {"yaml": _replace("name: correctness", "name: ../../evil.py:reward")},
            422,
        ),
        (
            "a plugin inside the plugin dir that is missing",
            {"yaml": _replace("name: correctness", "name: absent.py:reward")},
            422,
        ),
        ("a plugin defining no such function", {"yaml": _replace("name: correctness", "name: installed.py:nope")}, 422),
        (
            "a dataset outside the allowed roots",
            {"yaml": _replace(dataset, "  dataset: /etc/appliance-secret.jsonl\n")},
            422,
        ),
        ("a dataset escaping the allowed roots", {"yaml": _replace(dataset, "  dataset: ../../../etc/x.jsonl\n")}, 422),
        (
            "an upload with a line that is not JSON",
            {"yaml": with_file, "uploads": {"data/train.jsonl": ROWS_OK + "{oops\n"}},
            422,
        ),
        (
            "an upload with an unknown row key",
            {"yaml": with_file, "uploads": {"data/train.jsonl": ROWS_OK + '{"questoin": "x"}\n'}},
            422,
        ),
        ("an empty upload", {"yaml": with_file, "uploads": {"data/train.jsonl": ""}}, 422),
        ("an upload under another name", {"yaml": with_file, "uploads": {"other.jsonl": ROWS_OK}}, 422),
        ("an oversized upload", {"yaml": with_file, "uploads": {"data/train.jsonl": ROWS_OK * 400}}, 413),
        ("a job name with '/'", {"yaml": _replace("name: malformed", "name: a/b")}, 422),
        ("a job name with '..'", {"yaml": _replace("name: malformed", "name: ../up")}, 422),
        ("a job that does not fit", {"yaml": GOOD + "device: {memory_budget: 10MiB}\n"}, 409),
        ("a request that is not a SubmitRequest", {"_raw": {"yaml": GOOD, "file_name": "x.yaml", "extra": 1}}, 422),
        ("a request with no job text", {"_raw": {"file_name": "x.yaml"}}, 422),
    ]


def test_thirty_malformed_submissions_each_get_a_4xx_and_nothing_is_stored(make_daemon, tmp_path):
    daemon = make_daemon(["--max-upload", "4KiB"])
    plugins = daemon.data_dir / "plugins"
    (plugins / "installed.py").write_text("def reward(prompt, completion, reference, metadata):\n    return 1.0\n")
    cases = malformed_cases(plugins)
    assert len(cases) == 30
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket_path)), base_url="http://x", timeout=60)
    client = daemon.client()
    try:
        for what, fields, status in cases:
            if "_raw" in fields:
                response = http.post("/jobs", json=fields["_raw"])
                assert response.status_code == status, (what, response.text)
                assert response.json()["error"], what
                continue
            with pytest.raises(ClientError) as refused:
                client.submit_text(f"{what.replace(' ', '_')}.yaml", fields["yaml"], fields.get("uploads"))
            error = refused.value
            assert error.status == status, (what, str(error), error.errors)
            assert str(error), what
            if status == 422:
                assert error.errors, f"{what}: a 422 must list the job file's errors"
            if status == 409:
                assert error.plan and error.plan["fits"] is False and "does not fit" in str(error)
        # Ids with path separators never reach a job.
        assert http.post("/jobs/..%2F..%2Fetc/cancel").status_code == 404
        assert http.get("/jobs/ABC").status_code == 400
        # Nothing stored, no upload kept, and the daemon still serves.
        assert client.jobs() == []
        assert list((daemon.data_dir / "jobs").iterdir()) == []
        assert list((daemon.data_dir / "uploads").iterdir()) == []
        assert client.status().jobs["queued"] == 0
        assert daemon.proc.poll() is None
    finally:
        http.close()


def test_a_refusal_lists_the_errors_exactly_as_config_check(make_daemon, tmp_path):
    daemon = make_daemon()
    job_file = tmp_path / "bad.yaml"
    job_file.write_text(
        _replace("model: smollm2-135m-instruct", "model: smollm2-135m-instrut")
        .replace("  steps: 3", "  stepz: 3")
        .replace("name: correctness", "name: corectness")
    )
    check = subprocess.run(
        [sys.executable, "-m", "appliance", "config", "check", str(job_file), "--data-dir", str(daemon.data_dir)],
        capture_output=True,
        text=True,
        env=daemon.env,
        cwd=REPO_ROOT,
    )
    assert check.returncode == 2
    submitted = daemon.cli("submit", str(job_file))
    assert submitted.returncode == 2
    assert submitted.stderr.splitlines() == check.stderr.splitlines()
    assert len(check.stderr.splitlines()) == 3


def test_an_uploaded_dataset_is_checked_and_a_dataset_in_the_root_is_read_in_place(make_daemon, tmp_path):
    daemon = make_daemon()
    job = GOOD.replace(
        "  dataset: builtin:multiply\n  operand_min: 2\n  operand_max: 5\n  held_out: 4\n",
        "  dataset: data/train.jsonl\n  held_out: 1\n",
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(ROWS_OK + '{"question": 5}\n')
    (tmp_path / "job.yaml").write_text(job)
    with Client(daemon.socket_path) as client:
        with pytest.raises(ClientError) as refused:
            client.submit(tmp_path / "job.yaml", dry_run=True)
        assert refused.value.status == 422
        [line] = refused.value.errors
        assert "data/train.jsonl:5: 'question' must be a non-empty string" in line
        assert str(daemon.data_dir / "uploads") not in line
        (tmp_path / "data" / "train.jsonl").write_text(ROWS_OK)
        assert client.submit(tmp_path / "job.yaml", dry_run=True).plan["fits"] is True
        # The same name inside the daemon's dataset root is read there, not uploaded.
        (daemon.data_dir / "datasets" / "data").mkdir()
        (daemon.data_dir / "datasets" / "data" / "train.jsonl").write_text(ROWS_OK)
        in_root = client.submit_text("job.yaml", job, dry_run=True)
        assert in_root.plan["fits"] is True
