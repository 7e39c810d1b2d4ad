"""The optional TCP control port: off by default; with --control-addr and a 0600 token file every request
needs the bearer token (401 and an audit line otherwise), the CLI talks to it, the Unix socket is unchanged.

These start real `appliance serve` processes on loopback; no model is loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from appliance.service.client import Client, ClientError
from daemon_support import REPO_ROOT, free_port, tiny_job
from test_control_surface import _listening_tcp_ports

TOKEN = "s3cret-token-for-the-tcp-port-0123456789"


def token_file(folder: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path = folder / "control.token"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def audit_lines(daemon) -> list[dict]:
    return [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]


def raw_request(port: int, request: bytes) -> tuple[int, int, dict]:
    """(status, our local port, JSON body) of one HTTP/1.0 request on a fresh loopback connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        local_port = sock.getsockname()[1]
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), local_port, json.loads(body)


@pytest.fixture
def tcp_daemon(make_daemon, tmp_path):
    port = free_port()
    daemon = make_daemon(["--control-addr", f"127.0.0.1:{port}", "--control-token-file", str(token_file(tmp_path))])
    daemon.control_port = port
    return daemon


def test_the_tcp_port_answers_only_with_the_token_and_audits_refusals(tcp_daemon):
    daemon, port = tcp_daemon, tcp_daemon.control_port
    # The same check that finds no control port by default (test_control_surface) finds this one.
    assert sorted(_listening_tcp_ports(daemon.proc.pid)) == sorted(
        [("0100007F", daemon.metrics_port), ("0100007F", port)]
    )
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10) as http:
        missing = http.get("/status")
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"].startswith("no bearer token")
        wrong = http.post("/jobs/0123456789/cancel", headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
        assert wrong.status_code == 401 and wrong.json()["error"].startswith("wrong bearer token")
        basic = http.get("/jobs", headers={"Authorization": "Basic " + TOKEN})
        assert basic.status_code == 401
        right = http.get("/status", headers={"Authorization": "Bearer " + TOKEN})
        assert right.status_code == 200, right.text
        assert right.json()["caller_uid"] is None  # no SO_PEERCRED on TCP
    status, local_port, body = raw_request(
        port, b"GET /jobs HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer nope\r\nX-Forwarded-For: 10.9.9.9\r\n\r\n"
    )
    assert status == 401 and body["error"].startswith("wrong bearer token")
    lines = audit_lines(daemon)
    assert [(line["action"], line["outcome"]) for line in lines] == [
        ("authenticate", "refused: no bearer token (GET /status)"),
        ("authenticate", "refused: wrong bearer token (POST /jobs/0123456789/cancel)"),
        ("authenticate", "refused: no bearer token (GET /jobs)"),
        ("authenticate", "refused: wrong bearer token (GET /jobs)"),
    ]
    assert all(
        line["transport"] == "tcp"
        and line["uid"] is None
        and line["pid"] is None
        and line["user"] is None
        and line["remote"].startswith("127.0.0.1:")
        for line in lines
    )
    # The address is the connection's own, not a header's.
    assert lines[-1]["remote"] == f"127.0.0.1:{local_port}"
    # The Unix socket works as before, without any token.
    with Client(daemon.socket_path) as client:
        assert client.status().caller_uid == os.getuid()


def test_the_cli_talks_to_the_tcp_port_and_its_calls_are_audited_as_tcp(tcp_daemon, tmp_path):
    daemon, port = tcp_daemon, tcp_daemon.control_port
    job_file = tmp_path / "tiny.yaml"
    job_file.write_text(tiny_job())
    (tmp_path / "client").mkdir()
    client_token = token_file(tmp_path / "client")

    def jobs(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "appliance", "jobs", *args],
            capture_output=True,
            text=True,
            env={**daemon.env, **(env or {})},
            cwd=REPO_ROOT,
            timeout=60,
        )

    flags = ["--control-addr", f"127.0.0.1:{port}", "--token-file", str(client_token)]
    dry = jobs("submit", str(job_file), "--dry-run", "--json", *flags)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True
    refused = jobs("cancel", "0123456789", *flags)
    assert refused.returncode == 2 and "no job '0123456789'" in refused.stderr
    listed = jobs(
        "list", "--json", env={"APPLIANCE_CONTROL_ADDR": f"127.0.0.1:{port}", "APPLIANCE_TOKEN_FILE": str(client_token)}
    )
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    os.chmod(client_token, 0o640)
    loose = jobs("list", *flags)
    assert loose.returncode == 2 and f"chmod 600 {client_token}" in loose.stderr
    no_token = jobs("list", "--control-addr", f"127.0.0.1:{port}")
    assert no_token.returncode == 1 and "--token-file" in no_token.stderr
    lines = audit_lines(daemon)
    assert [
        (line["action"], line["transport"], line["uid"], line["outcome"].split(" (")[0].split(":")[0]) for line in lines
    ] == [
        ("submit", "tcp", None, "received"),  # written before the file is checked
        ("dry_run", "tcp", None, "ok"),
        ("cancel", "tcp", None, "refused"),
    ]
    assert all(line["remote"].startswith("127.0.0.1:") for line in lines)
    # The library client too (the TUI's and scripts'): the right token works, a wrong one is a 401.
    with Client(control_addr=f"127.0.0.1:{port}", token=TOKEN) as client:
        assert client.status().caller_uid is None
    with Client(control_addr=f"127.0.0.1:{port}", token="x" * 20) as client, pytest.raises(ClientError) as wrong:
        client.status()
    assert wrong.value.status == 401


@pytest.mark.parametrize("case", ["group-readable", "empty", "missing", "no-file-flag"])
def test_the_daemon_refuses_to_start_with_a_bad_token_file(make_daemon, tmp_path, case):
    port = free_port()
    path = {
        "group-readable": lambda: token_file(tmp_path, mode=0o640),
        "empty": lambda: token_file(tmp_path, text="\n"),
        "missing": lambda: tmp_path / "absent.token",
        "no-file-flag": lambda: None,
    }[case]()
    args = ["--control-addr", f"127.0.0.1:{port}"] + (["--control-token-file", str(path)] if path else [])
    daemon = make_daemon(args, start=False)
    daemon.start(wait=False)
    assert daemon.proc.wait(60) == 2
    error = daemon.log().strip().splitlines()[-1]
    expected = {
        "group-readable": f"readable or writable by group or others (mode 0640); restrict it with: chmod 600 {path}",
        "empty": "the file is empty",
        "missing": "no such file",
        "no-file-flag": "--control-addr needs --control-token-file FILE",
    }[case]
    assert error.startswith("error: ") and expected in error, error
    if path:
        assert str(path) in error
    assert not daemon.socket_path.exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_connections_that_never_send_a_request_are_audited_in_summary(tcp_daemon):
    """Pre-authentication: no request, so no token to refuse; the listener counts them for the audit log."""
    daemon, port = tcp_daemon, tcp_daemon.control_port
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
    time.sleep(1.0)
    daemon.stop()  # the summary of the window is written when the daemon stops (else once a minute)
    for sock in held:
        sock.close()
    summaries = [line for line in audit_lines(daemon) if line["action"] == "connections"]
    assert summaries and summaries[0]["transport"] == "tcp" and summaries[0]["remote"] == "loopback"
    counted = summaries[0]["outcome"]
    assert "300 opened" in counted and "evicted" in counted, counted  # past the 32-per-address cap


def test_a_flood_from_every_loopback_address_neither_fills_the_port_nor_rotates_the_audit(tcp_daemon):
    """What an account outside the group did to the TCP control port: 300 connections, each from another address
    of 127.0.0.0/8, each trickling a body after its 401; then a refused request from each of 300 more addresses.
    Before, the token holder got 503s for as long as it went on, and every address had its own 20 audit lines."""
    daemon, port = tcp_daemon, tcp_daemon.control_port
    held = []
    for number in range(300):
        sock = socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=(f"127.1.{number // 250}.{2 + number % 250}", 0)
        )
        sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
        held.append(sock)
    time.sleep(0.5)
    for sock in held:
        with contextlib.suppress(OSError):  # past the port's cap of 256 some were evicted already
            sock.send(b" ")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        answers = [http.get("/status", headers={"Authorization": "Bearer " + TOKEN}).status_code for _ in range(5)]
    assert answers == [200] * 5
    for sock in held:
        sock.close()
    for number in range(300):
        sock = socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=(f"127.2.{number // 250}.{2 + number % 250}", 0)
        )
        with sock:
            sock.sendall(b"GET /jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 401")
    daemon.stop()
    refused = [line for line in audit_lines(daemon) if line["action"] == "authenticate"]
    assert len(refused) <= 20, f"{len(refused)} full lines: the flood is not counted as one caller"
    summary = [line for line in audit_lines(daemon) if line["action"] == "summary"]
    assert summary and summary[0]["remote"] == "loopback" and "authenticate refused" in summary[0]["outcome"]
