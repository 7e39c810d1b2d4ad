"""Helpers for tests that run the real daemon: `appliance serve` processes, the real client, a real Prometheus.

Importable from any test as `daemon_support` (tests/ is on sys.path). The
fixtures built on them (tests/service/conftest.py) stop everything they start,
also when a test fails: daemons (SIGTERM, then SIGKILL), the worker process
groups they left, and Prometheus. Sockets live in short /tmp folders (a Unix
socket path must stay under 108 bytes); every TCP port is on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from store_support import link_model_store  # noqa: F401  (re-exported for the daemon tests)

from appliance.service.client import Client
from appliance.service.groups import live_members

WORKER_MODULE = "appliance.service.worker"
REPO_ROOT = Path(__file__).resolve().parent.parent


def tiny_job(name: str = "tiny", steps: int = 3, extra: str = "") -> str:
    """A job that runs in seconds on the CPU with the bundled model (unquantized: 4-bit on a CPU is slower)."""
    return f"""\
name: {name}
student:
  model: smollm2-135m-instruct
  quantization: none
  lora: {{rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}}
task:
  dataset: builtin:multiply
  operand_min: 2
  operand_max: 5
  held_out: 4
rewards:
  - {{name: correctness, weight: 1.0}}
  - {{name: answer_format, weight: 0.5}}
grpo:
  group_size: 2
  prompts_per_step: 1
  max_new_tokens: 8
  steps: {steps}
checkpoint:
  every: 1
  keep_last: 2
  eval_every: null
{extra}"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def short_tmp_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="apl-", dir="/tmp"))


def worker_pids(data_dir: Path) -> list[int]:
    """Live worker processes serving jobs of `data_dir`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "stat").read_text()
        except OSError:
            continue
        if WORKER_MODULE.encode() in cmdline and any(str(data_dir).encode() == part for part in cmdline):
            if status[status.rindex(")") + 2] != "Z":
                found.append(int(entry.name))
    return found


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in process group `pgid`."""
    return bool(live_members(pgid))


def kill_workers(data_dir: Path) -> None:
    for pid in worker_pids(data_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def daemon_env(extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("NOTIFY_SOCKET", None)
    env.pop("WATCHDOG_USEC", None)
    env.update(extra or {})
    return env


@dataclass
class Daemon:
    """One `python -m appliance serve` process."""

    data_dir: Path
    socket_path: Path
    metrics_port: int
    log_path: Path
    args: list[str]
    env: dict
    proc: subprocess.Popen | None = None
    clients: list = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)  # e.g. unshare: what the daemon runs under

    def start(self, wait: bool = True) -> "Daemon":
        command = [
            *self.prefix,
            sys.executable,
            "-m",
            "appliance",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--socket",
            str(self.socket_path),
            "--metrics-addr",
            f"127.0.0.1:{self.metrics_port}",
            *self.args,
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO_ROOT)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        def answers():
            if self.proc.poll() is not None:
                raise AssertionError(f"the daemon exited with {self.proc.returncode}:\n{self.log()}")
            if not self.socket_path.exists():
                return False
            try:
                with Client(self.socket_path, timeout=5) as client:
                    return client.status()
            except Exception:
                return False

        wait_for(answers, timeout, f"the daemon on {self.socket_path}")

    def client(self, timeout: float = 30.0) -> Client:
        client = Client(self.socket_path, timeout=timeout)
        self.clients.append(client)
        return client

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "appliance", "jobs", *args, "--socket", str(self.socket_path)],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=REPO_ROOT,
            timeout=timeout,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def wait_state(self, job_id: str, states, timeout: float = 900.0):
        states = {states} if isinstance(states, str) else set(states)
        client = self.client()

        def reached():
            job = client.job(job_id)
            if job.state in {"failed"} - states:
                raise AssertionError(f"job {job_id} failed: {job.reason}\n{self.log()}")
            return job if job.state in states else None

        return wait_for(reached, timeout, f"job {job_id} to become {'/'.join(sorted(states))}", interval=0.3)

    def wait_step(self, job_id: str, step: int, timeout: float = 900.0):
        client = self.client()
        return wait_for(
            lambda: (job := client.job(job_id)).step >= step and job,
            timeout,
            f"job {job_id} to finish step {step}",
            interval=0.2,
        )

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.stop(signal.SIGTERM, timeout=30)
        kill_workers(self.data_dir)


# ----- Prometheus ---------------------------------------------------------------------------------

PROMETHEUS = shutil.which("prometheus")


@contextlib.contextmanager
def run_prometheus(targets: list[str], scrape_interval: str = "1s"):
    """Debian's `prometheus` on loopback with a temporary storage dir, scraping `targets`; yields its base URL."""
    if PROMETHEUS is None:
        pytest.fail("the 'prometheus' program is missing; install Debian's package: apt-get install -y prometheus")
    folder = Path(tempfile.mkdtemp(prefix="apl-prom-"))
    config = folder / "prometheus.yml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
                "scrape_configs": [{"job_name": "appliance", "static_configs": [{"targets": targets}]}],
            }
        )
    )
    port = free_port()
    log = open(folder / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready():
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {(folder / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(ready, 60, "prometheus to be ready")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def prometheus_query(base: str, query: str) -> list[dict]:
    """The result vector of an instant query through Prometheus's HTTP API."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


# ----- other users ----------------------------------------------------------------------------------------


def can_switch_users() -> bool:
    """Root can act as other uids (what setpriv does for a command), here by forking and dropping privileges."""
    return os.geteuid() == 0


def as_user(uid: int, gid: int, groups: tuple[int, ...], fn, *args, timeout: float = 600.0):
    """fn(*args) in a forked child that runs as `uid`/`gid` with supplementary `groups`; its return value.

    The interpreter cannot be started again as another uid here (its install is private to root), so the child
    forks with every module already imported, then drops privileges; `fn` must use only loaded modules
    (unix_request below does)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            payload = json.dumps({"value": fn(*args)})
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            payload, status = json.dumps({"error": f"{type(error).__name__}: {error}"}), 1
        with os.fdopen(write_end, "w") as out:
            out.write(payload)
        os._exit(status)
    os.close(write_end)
    deadline, data = time.monotonic() + timeout, b""
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"uid {uid}'s call did not end within {timeout:.0f} s")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    text = data.decode()
    result = json.loads(text)
    if "error" in result:
        raise AssertionError(f"as uid {uid}: {result['error']}")
    return result["value"]


def unix_request(socket_path, method: str, path: str, body: dict | None = None, timeout: float = 60.0):
    """(status, JSON answer) of one request over the daemon's socket, with the standard library only."""
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(socket_path))
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head_text, _, payload = answer.partition(b"\r\n\r\n")
    status = int(head_text.split(b" ", 2)[1])
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, {"raw": payload.decode(errors="replace")}


def open_socket_dir(daemon: "Daemon", gid: int) -> None:
    """Let members of `gid` reach the daemon's socket (its folder is private to root by default)."""
    os.chmod(daemon.socket_path.parent, 0o711)


def forked_ranks(launcher: int) -> dict[int, int]:
    """Local rank -> pid of the ranks under a launcher: its forked children (the launcher's own command line),
    started in rank order (ranks.launch_ranks)."""
    try:
        command = Path(f"/proc/{launcher}/cmdline").read_bytes()
    except OSError:
        return {}
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == launcher:
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            same = (entry / "cmdline").read_bytes() == command
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher and same:
            children.append(int(entry.name))
    return dict(enumerate(sorted(children)))
