"""Hostile requests against a real daemon: each gets its 4xx within a second, nothing is stored, memory stays flat."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import pytest

from appliance.service import audit
from daemon_support import Daemon, daemon_env, free_port, link_model_store, short_tmp_dir, tiny_job

ALLOWED = "http://127.0.0.1:9/v1"
JOB_ID = "0123456789"
ANSWERS: list[tuple[int, float]] = []  # (status, seconds) of every request raw() sent, for the closing check


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store_data_dir):
    data_dir = link_model_store(store_data_dir, tmp_path_factory.mktemp("hostile") / "data")
    secrets = data_dir / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "good.token").write_text("x" * 32)
    os.chmod(secrets / "good.token", 0o600)
    (secrets / "shared.token").write_text("x" * 32)
    os.chmod(secrets / "shared.token", 0o644)
    outside = tmp_path_factory.mktemp("outside") / "stolen.token"
    outside.write_text("y" * 32)
    os.chmod(outside, 0o600)
    (secrets / "link.token").symlink_to(outside)
    folder = short_tmp_dir()
    server = Daemon(
        data_dir,
        folder / "control.sock",
        free_port(),
        tmp_path_factory.mktemp("log") / "daemon.log",
        ["--max-upload", "1MiB", "--judge-endpoint", ALLOWED],
        daemon_env(),
    )
    server.outside = outside
    yield server.start()
    server.close()


@pytest.fixture(scope="module")
def rss_at_start(daemon) -> int:
    return rss_kib(daemon.proc.pid)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def raw(daemon, head: str, body_chunks=(), timeout: float = 5.0) -> tuple[int, dict]:
    """Send `head` then the chunks on the Unix socket; the status and JSON body of the answer (timed in ANSWERS)."""
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(daemon.socket_path))
        sock.sendall(head.encode())
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered and closed before the whole body
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            part = sock.recv(65536)
            if not part:
                break
            data += part
    head_text, _, body = data.partition(b"\r\n\r\n")
    status = int(head_text.split(b" ", 2)[1])
    ANSWERS.append((status, time.monotonic() - started))
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {}


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def request(daemon, method: str, path: str, payload: dict | None = None) -> tuple[int, dict]:
    body = json.dumps(payload).encode() if payload is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return raw(daemon, head, [body])


def submit(daemon, text: str, dry_run: bool = False, name: str = "job.yaml") -> tuple[int, dict]:
    return request(daemon, "POST", "/jobs", {"yaml": text, "file_name": name, "dry_run": dry_run, "uploads": {}})


def alias_bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def judged(extra: str) -> str:
    return tiny_job(extra="judge:\n  model: remote-judge\n" + extra)


BOMBS = {
    "billion laughs": alias_bomb(9, 9),
    "wide": alias_bomb(4, 200),
    "anchored mapping merged": "base: &b {x: 1}\nname: {<<: *b}\n",
    "alias in a job": tiny_job().replace("steps: 3", "steps: &s 3\n  max_prompts: *s"),
    "anchor only": tiny_job().replace("name: tiny", "name: &n tiny"),
    "nested alias keys": "a: &a {k: [1, 2]}\nb: {*a : 1}\n",
}
DEEP = {
    "deep lists": "name: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep mappings": "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n",
    "deep unterminated": "x: " + "{a: " * 3000,
}


def test_rss_is_measured_from_the_start(rss_at_start):
    assert rss_at_start > 0


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize("shape", list(BOMBS) + list(DEEP))
def test_yaml_bombs_and_depth_are_refused_with_the_line(daemon, shape, dry_run):
    started = time.monotonic()
    status, body = submit(daemon, {**BOMBS, **DEEP}[shape], dry_run=dry_run, name="bomb.yaml")
    assert time.monotonic() - started < 1.0
    assert status == 422, body
    assert "bomb.yaml" in body["errors"][0]["file"] and body["errors"][0]["line"] >= 1
    assert any(word in body["errors"][0]["message"] for word in ("anchors", "nested", "YAML syntax"))


def test_body_over_the_limit_by_content_length_is_refused_before_it_is_sent(daemon):
    before = rss_kib(daemon.proc.pid)
    started = time.monotonic()
    head = "POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 209715200\r\n\r\n"
    status, body = raw(daemon, head, [b"{" + b" " * 65536])
    assert status == 413 and "limit" in body["error"], body
    assert time.monotonic() - started < 1.0
    assert rss_kib(daemon.proc.pid) - before < 50 * 1024


def test_streamed_body_without_content_length_is_cut_off(daemon):
    before = rss_kib(daemon.proc.pid)
    chunk = b" " * (1 << 20)
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(200)]
    head = "POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    started = time.monotonic()
    status, body = raw(daemon, head, chunks)
    assert status == 413, body
    assert time.monotonic() - started < 1.0
    assert rss_kib(daemon.proc.pid) - before < 50 * 1024


def test_lying_content_length_is_refused(daemon):
    head = "POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n"
    with pytest.raises((AssertionError, ValueError, IndexError)):
        assert raw(daemon, head)[0] < 400


@pytest.mark.parametrize("route", ["samples", "judge", "metrics"])
def test_limits_past_a_machine_integer_are_refused(daemon, route):
    status, body = request(daemon, "GET", f"/jobs/{JOB_ID}/{route}?limit=99999999999999999999999999")
    assert status in (404, 422), body  # never a 500, never a read


@pytest.mark.parametrize(
    "query", ["after=99999999999999999999999999", "after=-1", "timeout=nan", "timeout=1e400", "job=" + "a" * 100]
)
def test_an_events_cursor_past_64_bits_or_an_endless_wait_is_refused(daemon, query):
    started = time.monotonic()
    status, body = request(daemon, "GET", f"/events?{query}")
    assert status == 422 and time.monotonic() - started < 1.0, body  # the cursor was a 500 from SQLite


def secret_cases(daemon) -> dict:
    return {
        "absolute outside": str(daemon.outside),
        "relative traversal": "../../" + str(daemon.outside).lstrip("/"),
        "symlinked out": "link.token",
        "not owner-only": "shared.token",
        "a folder": ".",
        "missing": "none.token",
        "proc": "/proc/self/environ",
    }


@pytest.mark.parametrize(
    "case", ["absolute outside", "relative traversal", "symlinked out", "not owner-only", "a folder", "missing", "proc"]
)
def test_token_files_outside_the_secrets_root_are_refused(daemon, case):
    text = judged(f"  endpoint: {ALLOWED}\n  token_file: {secret_cases(daemon)[case]}\n")
    status, body = submit(daemon, text, dry_run=True)
    assert status == 422, body
    assert [e["key"] for e in body["errors"]] == ["judge.token_file"], body


@pytest.mark.parametrize(
    "endpoint", ["http://127.0.0.1:8000/v1", "http://evil.example/v1", "https://127.0.0.1:9/v1", "http://[::1]:9/v1"]
)
def test_endpoints_off_the_allow_list_are_refused(daemon, endpoint):
    status, body = submit(daemon, judged(f"  endpoint: {endpoint}\n  token_file: good.token\n"), dry_run=True)
    assert status == 422, body
    assert [e["key"] for e in body["errors"]] == ["judge.endpoint"]


def test_a_remote_judge_on_the_allow_list_with_a_confined_token_is_accepted(daemon):
    status, body = submit(daemon, judged(f"  endpoint: {ALLOWED}/\n  token_file: good.token\n"), dry_run=True)
    assert status == 200, body  # judge.model is not in the model store, and need not be


@pytest.mark.parametrize(
    "path",
    [
        "/jobs/..%2f..%2fetc",
        "/jobs/../../etc/passwd/log",
        f"/jobs/{JOB_ID}%00/log",
        "/jobs/%2e%2e/metrics",
        "/events?job=../x",
        "/jobs/[red]x[/red]/cancel",
    ],
)
def test_traversal_and_markup_in_names_are_refused(daemon, path):
    method = "POST" if path.endswith("cancel") else "GET"
    status, body = request(daemon, method, path)
    assert 400 <= status < 500 and "root:x:0" not in json.dumps(body)


@pytest.mark.parametrize(
    "field,value",
    [
        ("dataset", "../../../../etc/passwd"),
        ("dataset", "/etc/shadow"),
        ("plugin", "../../../tmp/evil.py:f"),
        ("name", "[bold red]x[/]"),
        ("name", "../../x"),
    ],
)
def test_traversal_and_markup_in_job_fields_are_refused(daemon, field, value):
    text = tiny_job()
    if field == "dataset":
        text = text.replace("builtin:multiply", value)
    elif field == "plugin":
        text = text.replace("name: correctness", f"name: '{value}'")
    else:
        text = text.replace("name: tiny", f"name: '{value}'")
    status, body = submit(daemon, text)
    assert status == 422, body


def test_export_names_cannot_escape(daemon):
    status, _ = request(daemon, "POST", f"/jobs/{JOB_ID}/export", {"name": "../../etc"})
    assert 400 <= status < 500


def test_daemon_still_serves_and_stored_nothing(daemon, rss_at_start):
    growth_kib = rss_kib(daemon.proc.pid) - rss_at_start
    refusals = [seconds for status, seconds in ANSWERS if 400 <= status < 500]
    print(
        f"{len(refusals)} hostile requests refused, slowest {max(refusals) * 1000:.0f} ms; "
        f"daemon RSS grew {growth_kib / 1024:.1f} MiB over the module"
    )
    assert len(refusals) >= 40 and max(refusals) < 1.0
    assert growth_kib < 100 * 1024
    client = daemon.client()
    assert client.status().jobs.get("queued", 0) == 0
    assert client.jobs() == []
    assert not any((daemon.data_dir / "uploads").glob("*")) if (daemon.data_dir / "uploads").exists() else True
    assert not any((daemon.data_dir / "jobs").glob("*")) if (daemon.data_dir / "jobs").exists() else True
    assert daemon.proc.poll() is None
    daemon.stop()  # the audit log sums what it did not write in full when it closes
    lines = [json.loads(line) for line in (daemon.data_dir / "audit.jsonl").read_text().splitlines()]
    written = [line for line in lines if line["action"] != "summary"]
    assert len(written) <= audit.WRITTEN_PER_WINDOW, "one caller wrote more than its window's lines in full"
    summed = sum(
        int(count)
        for line in lines
        if line["action"] == "summary"
        for count, _action, outcome in re.findall(r"(\d+) (\w+) (\w+)", line["outcome"].split(": ", 1)[1])
        if outcome == "refused"
    )
    # every 4xx above but the negative Content-Length, which the HTTP parser refuses before the app
    assert sum(line["outcome"].startswith("refused") for line in written) + summed >= 46, lines
