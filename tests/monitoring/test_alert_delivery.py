"""Alerts arrive: Debian's real Alertmanager, configured with the shipped alertmanager.yml and only the guide's
EDIT lines changed, mails a firing alert to a plain SMTP relay (a small stdlib sink on loopback); the real
Prometheus with the shipped rules sends the always-firing Watchdog through it to the dead-man's switch
(a webhook sink); Alertmanager runs with the shipped /etc/default flags: loopback only, no gossip port.
Alertmanager's default smtp_require_tls (true) would send nothing to that relay: each refused attempt is counted
(alertmanager_notification_requests_failed_total), and once its retries run out so is the notification
(alertmanager_notifications_failed_total, which AlertmanagerNotificationsFailing watches)."""

from __future__ import annotations

import json
import re
import shlex
import socket
import socketserver
import subprocess
import threading
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from daemon_support import free_port, wait_for
from packaging_support import need_tool

IMAGES = Path(__file__).resolve().parents[2] / "images"


class SmtpSink(socketserver.ThreadingTCPServer):
    """A plain mail relay (no TLS, no auth) that keeps every message it is given."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _SmtpSession)
        self.messages: list[dict] = []


class _SmtpSession(socketserver.StreamRequestHandler):
    timeout = 30

    def handle(self):
        reply = lambda text: self.wfile.write(text.encode() + b"\r\n")  # noqa: E731
        reply("220 sink.test ESMTP")
        message = {"from": "", "to": [], "data": ""}
        while line := self.rfile.readline(65536).decode(errors="replace").rstrip("\r\n"):
            verb = line.split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                reply("250 sink.test")
            elif verb == "MAIL":
                message["from"] = line
                reply("250 ok")
            elif verb == "RCPT":
                message["to"].append(line)
                reply("250 ok")
            elif verb == "DATA":
                reply("354 go on")
                lines = []
                while (data := self.rfile.readline(1 << 20).decode(errors="replace")) not in (".\r\n", ""):
                    lines.append(data)
                message["data"] = "".join(lines)
                self.server.messages.append(dict(message))
                reply("250 queued")
            elif verb == "QUIT":
                reply("221 bye")
                return
            else:
                reply("250 ok")


class WebhookSink(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Webhook)
        self.posts: list[dict] = []


class _Webhook(BaseHTTPRequestHandler):
    def do_POST(self):
        self.server.posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def serving(server):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def guide_edits(smtp_port: int, webhook_port: int, require_tls: bool | None = None) -> str:
    """alertmanager.yml with the values an administrator types on its EDIT lines, nothing else changed."""
    text = (IMAGES / "alertmanager.yml").read_text()
    edits = {
        "smtp_smarthost": f'"127.0.0.1:{smtp_port}"',
        "smtp_from": '"appliance@box.test"',
        "- to": '"ml-admins@lab.test"',
        "- url": f'"http://127.0.0.1:{webhook_port}/ping/appliance-box"',
    }
    if require_tls is not None:
        edits["smtp_require_tls"] = "true" if require_tls else "false"
    for key, value in edits.items():
        text, count = re.subn(rf"(?m)^(\s*{re.escape(key)}:) [^#\n]*(# EDIT.*)$", rf"\1 {value}  \2", text)
        assert count == 1, f"no EDIT line for {key}"
    return text


def shipped_args(name: str, port: int) -> list[str]:
    """ARGS of the shipped /etc/default file, with the test's own port on the same loopback address."""
    line = next(line for line in (IMAGES / name).read_text().splitlines() if line.startswith("ARGS="))
    args = shlex.split(shlex.split(line[len("ARGS=") :])[0])
    return [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", arg) for arg in args]


@contextmanager
def process(argv: list[str], log: Path):
    with open(log, "wb") as output:
        proc = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def listening(pid: int) -> set[str]:
    """'ADDR:PORT/tcp|udp' of every socket the process holds that is bound (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = fd.readlink() if fd.is_symlink() else Path("")
        if str(target).startswith("socket:["):
            inodes.add(str(target)[8:-1])
    found = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode in inodes and (state == "0A" or table.startswith("udp")):
                address, port = local.split(":")
                host = socket.inet_ntop(
                    socket.AF_INET if len(address) == 8 else socket.AF_INET6,
                    bytes.fromhex(address)[::-1] if len(address) == 8 else _ipv6(address),
                )
                found.add(f"{host}:{int(port, 16)}/{table.rstrip('6')}")
    return found


def _ipv6(hexed: str) -> bytes:
    raw = bytes.fromhex(hexed)
    return b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@contextmanager
def alertmanager(config_text: str, folder: Path):
    binary = need_tool("prometheus-alertmanager", "prometheus-alertmanager")
    config = folder / "alertmanager.yml"
    config.write_text(config_text)
    port = free_port()
    argv = [binary, *shipped_args("prometheus-alertmanager.default", port)]
    argv += [f"--config.file={config}", f"--storage.path={folder / 'data'}"]
    with process(argv, folder / "alertmanager.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(url, proc, folder / "alertmanager.log"), 60, "Alertmanager to be ready")
        yield url, proc


def _ready(url: str, proc, log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"alertmanager exited: {log.read_text()[-2000:]}")
    try:
        return get(url + "/-/ready") is not None
    except OSError:
        return False


def fire(url: str, **labels: str) -> None:
    amtool = need_tool("amtool", "prometheus-alertmanager")
    pairs = [f"{key}={value}" for key, value in labels.items()]
    done = subprocess.run(
        [amtool, "alert", "add", *pairs, f"--alertmanager.url={url}", "--annotation=summary=test alert"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def email_attempts_failed(url: str) -> float:
    text = get(url + "/metrics")
    pattern = r'^alertmanager_notification_requests_failed_total\{[^}]*integration="email"[^}]*\} (\S+)$'
    return sum(map(float, re.findall(pattern, text, re.MULTILINE)))


def test_a_firing_alert_is_mailed_the_watchdog_pings_and_a_tls_mismatch_is_counted(tmp_path: Path):
    """One run, two Alertmanagers: the shipped choice (a plain relay) mails; Alertmanager's default
    (smtp_require_tls: true) sends the same relay nothing and counts each refused attempt."""
    prometheus = need_tool("prometheus", "prometheus")
    (tmp_path / "plain").mkdir()
    (tmp_path / "tls").mkdir()
    with serving(SmtpSink()) as smtp, serving(WebhookSink()) as webhook, serving(SmtpSink()) as smtp_tls:
        config = guide_edits(smtp.server_address[1], webhook.server_address[1])
        strict = guide_edits(smtp_tls.server_address[1], webhook.server_address[1], require_tls=True)
        with (
            alertmanager(config, tmp_path / "plain") as (url, proc),
            alertmanager(strict, tmp_path / "tls") as (
                strict_url,
                _,
            ),
        ):
            rules = yaml.safe_load((IMAGES / "prometheus.yml").read_text())
            rules["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [url.removeprefix("http://")]
            rules["rule_files"] = [str(IMAGES / "alerts.yml")]
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(rules))
            port = free_port()
            argv = [
                prometheus,
                *shipped_args("prometheus.default", port),
                f"--config.file={tmp_path / 'prometheus.yml'}",
            ]
            argv += [f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
            with process(argv, tmp_path / "prometheus.log"):
                for target in (url, strict_url):
                    fire(target, alertname="ApplianceDaemonDown", severity="critical", instance="127.0.0.1:9464")

                pinged = wait_for(lambda: webhook.posts, 90, "the Watchdog at the dead-man's switch")
                mailed = wait_for(lambda: smtp.messages, 90, "the alert's mail at the relay")
                wait_for(lambda: email_attempts_failed(strict_url) > 0, 90, "a refused email attempt to be counted")
            bound = listening(proc.pid)

    assert [alert["labels"]["alertname"] for alert in pinged[0]["alerts"]] == ["Watchdog"]
    assert pinged[0]["status"] == "firing"
    assert "ApplianceDaemonDown" in mailed[0]["data"] and "ml-admins@lab.test" in mailed[0]["to"][0]
    assert "appliance@box.test" in mailed[0]["from"]
    assert smtp_tls.messages == []  # the default TLS choice delivers nothing to a plain relay
    assert {entry.rsplit(":", 1)[0] for entry in bound} == {"127.0.0.1"}, bound  # loopback only
    assert not any(entry.endswith(":9094/tcp") or entry.endswith("/udp") for entry in bound), bound  # no gossip


def test_a_broken_mail_path_silences_the_watchdog_so_the_dead_mans_switch_pages(tmp_path: Path):
    """The relay is down: AlertmanagerNotificationsFailing can only go by that same mail, so it must reach someone
    another way. Two Alertmanagers with the shipped routes and the same dead-man's switch: the one with a working
    path pings it with the Watchdog; the one whose notifications fail sends no Watchdog at all (inhibited), and
    the switch, missing its pings, pages."""
    closed = free_port()  # nothing listens there: the lab's relay is down
    (tmp_path / "working").mkdir()
    (tmp_path / "broken").mkdir()
    with serving(SmtpSink()) as smtp, serving(WebhookSink()) as webhook:
        working = guide_edits(smtp.server_address[1], webhook.server_address[1])
        broken = guide_edits(closed, webhook.server_address[1])
        with (
            alertmanager(working, tmp_path / "working") as (working_url, _),
            alertmanager(broken, tmp_path / "broken") as (broken_url, _),
        ):
            failing = {"severity": "critical", "integration": "email", "instance": "127.0.0.1:9093"}
            fire(broken_url, alertname="AlertmanagerNotificationsFailing", **failing)
            for url in (broken_url, working_url):
                fire(url, alertname="Watchdog", severity="none")
            wait_for(lambda: pings_from(webhook, working_url), 60, "the working Alertmanager's Watchdog")
            wait_for(lambda: alert_names(broken_url) >= {"Watchdog", "AlertmanagerNotificationsFailing"}, 30, "both")
            threading.Event().wait(5)  # the Watchdog's group_wait is 0 s: its ping would be here by now

            assert pings_from(webhook, broken_url) == []


def pings_from(webhook: WebhookSink, url: str) -> list[dict]:
    """The pings of the Alertmanager at `url` (its externalURL names the host, not the address, and the port)."""
    return [post for post in webhook.posts if post["externalURL"].rstrip("/").endswith(":" + url.rsplit(":", 1)[1])]


def alert_names(url: str) -> set[str]:
    return {alert["labels"]["alertname"] for alert in json.loads(get(url + "/api/v2/alerts"))}
