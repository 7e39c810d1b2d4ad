"""The issue's load figure, measured: under the shipped limits (soft nofile 1024, a memory cgroup, the Quadlet's
pids limit), 8 concurrent maximum-size dry runs (a job file at its size cap and an upload at the daemon's) from
8 members, plus 1,000 idle or half-sent connections held on each listener (control socket, TCP control port,
metrics port), leave /status p99 under 250 ms for another member, the daemon's RSS under 500 MiB, its threads
under 100 and its log under 10 MB. Needs root (cgroups, other uids)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import statistics
import threading
import time
from pathlib import Path

import pytest

from daemon_support import as_user, can_switch_users, free_port, open_socket_dir, tiny_job, unix_request

MEMBERS, ATTACKER, WATCHER = 4000, 4050, 4060
CALLERS = tuple(range(4070, 4078))  # the 8 members submitting maximum-size dry runs
SECONDS = 40.0
HELD = 1000
PIDS_MAX = 4096  # systemd/appliance.container: PidsLimit
MEMORY_MAX = 3 * 2**30
NOFILE_SOFT = 1024
UPLOAD_BYTES = 63 * 2**20  # under the default --max-upload of 64 MiB
# The load generators run at the checks' niceness: on a shared 2-core box the figure is the daemon's, not the
# scheduler's (the watcher, like the daemon, keeps its normal priority).
LOAD_NICENESS = 10


def cgroup_files(name: str) -> dict[str, Path] | None:
    """A memory and a pids cgroup for the daemon (v2 or v1), limits set; None where they cannot be made."""
    root = Path("/sys/fs/cgroup")
    try:
        if (root / "cgroup.controllers").exists():
            group = root / name
            group.mkdir()
            (group / "memory.max").write_text(str(MEMORY_MAX))
            (group / "pids.max").write_text(str(PIDS_MAX))
            return {"procs": group / "cgroup.procs", "memory": group / "memory.peak", "dirs": [group]}
        memory, pids = root / "memory" / name, root / "pids" / name
        memory.mkdir()
        pids.mkdir()
        (memory / "memory.limit_in_bytes").write_text(str(MEMORY_MAX))
        (pids / "pids.max").write_text(str(PIDS_MAX))
        return {
            "procs": [memory / "cgroup.procs", pids / "cgroup.procs"],
            "memory": memory / "memory.max_usage_in_bytes",
            "dirs": [memory, pids],
        }
    except OSError:
        return None


def max_size_body() -> bytes:
    """A dry run with a job file just under its 256 KiB cap and an upload just under the daemon's 64 MiB."""
    job = tiny_job("biggest").replace("dataset: builtin:multiply", "dataset: rows.jsonl")
    job = job.replace("  operand_min: 2\n  operand_max: 5\n", "")
    shot = '  - {question: "' + "q" * 4000 + '", answer: "' + "a" * 3900 + '"}\n'
    job = job.replace("  held_out: 4\n", "  held_out: 4\n  few_shot:\n" + shot * 32)
    assert 250_000 < len(job.encode()) <= 256 * 1024, len(job)
    row = json.dumps({"question": "What is the sum of the numbers " + "1 " * 20 + "?", "answer": "20"}) + "\n"
    rows = row * (UPLOAD_BYTES // len(row))
    body = json.dumps({"file_name": "biggest.yaml", "yaml": job, "dry_run": True, "uploads": {"rows.jsonl": rows}})
    return body.encode()


def send_raw(socket_path: str, body: bytes) -> tuple[int, float]:
    import socket as sockets

    started = time.monotonic()
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as sock:
        sock.settimeout(300)
        sock.connect(socket_path)
        head = f"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), time.monotonic() - started


def submit_for(socket_path: str, body: bytes, until: float) -> list:
    os.nice(LOAD_NICENESS)
    results = []
    while time.monotonic() < until:
        results.append(send_raw(socket_path, body))
    return results


def watch_status(socket_path: str, until: float) -> list[float]:
    latencies = []
    while time.monotonic() < until:
        started = time.monotonic()
        status, _ = unix_request(socket_path, "GET", "/status", timeout=30)
        latencies.append(time.monotonic() - started if status == 200 else 99.0)
        time.sleep(0.05)
    return latencies


async def hold(open_connection, until: float, counts: dict, half_sent: bool) -> None:
    """One attacker connection, held open (idle or with a half-sent head) and opened again whenever it is closed."""
    while time.monotonic() < until:
        try:
            reader, writer = await open_connection()
        except OSError:
            counts["refused"] += 1
            await asyncio.sleep(1.0)
            continue
        counts["opened"] += 1
        if half_sent:
            writer.write(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        try:
            await asyncio.wait_for(reader.read(), max(0.1, until - time.monotonic()))
        except (asyncio.TimeoutError, OSError):
            pass
        writer.close()
        await asyncio.sleep(1.0)


def attack(socket_path: str, tcp_port: int, metrics_port: int, until: float) -> dict:
    """HELD connections on each listener for as long as `until`; how many were opened over the attack."""
    os.nice(LOAD_NICENESS)
    resource.setrlimit(resource.RLIMIT_NOFILE, (8 * HELD, 8 * HELD))
    listeners = {
        "socket": lambda: asyncio.open_unix_connection(socket_path),
        "tcp": lambda: asyncio.open_connection("127.0.0.1", tcp_port),
        "metrics": lambda: asyncio.open_connection("127.0.0.1", metrics_port),
    }
    counts = {name: {"opened": 0, "refused": 0} for name in listeners}

    async def run() -> None:
        await asyncio.gather(
            *(hold(opener, until, counts[name], n % 2 == 1) for name, opener in listeners.items() for n in range(HELD))
        )

    asyncio.run(run())
    return counts


def sample(pid: int, stop: threading.Event, found: dict) -> None:
    while not stop.wait(0.25):
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            found["rss"] = max(found.get("rss", 0), int(fields["VmRSS"].split()[0]) * 1024)
            found["threads"] = max(found.get("threads", 0), int(fields["Threads"]))
            found["fds"] = max(found.get("fds", 0), len(os.listdir(f"/proc/{pid}/fd")))
        except (OSError, KeyError, ValueError):
            return


@pytest.mark.serial  # times the daemon's answers: alone on the box
@pytest.mark.slow
@pytest.mark.skipif(not can_switch_users(), reason="needs root: cgroups and other uids")
def test_the_daemon_stays_within_its_bounds_under_load_and_attack(make_daemon, tmp_path):
    name = f"appliance-load-{os.getpid()}"
    cgroup = cgroup_files(name)
    if cgroup is None:
        pytest.skip("no writable memory and pids cgroups here")
    procs = cgroup["procs"] if isinstance(cgroup["procs"], list) else [cgroup["procs"]]
    enter = "; ".join(f"echo $$ > {path}" for path in procs)
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 524288)
    token = tmp_path / "token"
    token.write_text("load-token-" + "x" * 24)
    token.chmod(0o600)
    tcp_port = free_port()
    body = max_size_body()
    try:
        daemon = make_daemon(
            ["--group", str(MEMBERS), "--control-addr", f"127.0.0.1:{tcp_port}", "--control-token-file", str(token)],
            prefix=["sh", "-c", f'{enter}; exec prlimit --nofile={NOFILE_SOFT}:{hard} -- "$@"', "sh"],
        )
        open_socket_dir(daemon, MEMBERS)
        assert (
            int(Path(f"/proc/{daemon.proc.pid}/limits").read_text().split("Max open files")[1].split()[0]) > NOFILE_SOFT
        )
        socket_path = str(daemon.socket_path)
        stats, stop = {}, threading.Event()
        sampler = threading.Thread(target=sample, args=(daemon.proc.pid, stop, stats), daemon=True)
        sampler.start()
        results: dict = {}
        start = time.monotonic()
        attack_until, until = start + SECONDS + 10, start + 5 + SECONDS
        threads = [
            threading.Thread(
                target=lambda: results.update(
                    attack=as_user(
                        ATTACKER, ATTACKER, (MEMBERS,), attack, socket_path, tcp_port, daemon.metrics_port, attack_until
                    )
                )
            )
        ]
        for caller in CALLERS:
            threads.append(
                threading.Thread(
                    target=lambda c=caller: results.update(
                        {c: as_user(c, c, (MEMBERS,), submit_for, socket_path, body, until)}
                    )
                )
            )
        threads.append(
            threading.Thread(
                target=lambda: results.update(
                    watch=as_user(WATCHER, WATCHER, (MEMBERS,), watch_status, socket_path, until)
                )
            )
        )
        threads[0].start()
        time.sleep(5)  # the connections are held before anything else starts
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join(SECONDS + 300)
        stop.set()
        figures(daemon, results, stats, cgroup)
    finally:
        for folder in cgroup["dirs"]:
            for _ in range(50):
                for pid in (folder / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)  # what is left of the daemon (its forkserver)
                    except ProcessLookupError:
                        pass
                try:
                    folder.rmdir()
                    break
                except OSError:
                    time.sleep(0.2)  # its processes are still leaving it


def figures(daemon, results: dict, stats: dict, cgroup: dict) -> None:
    latencies = sorted(results["watch"])
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
    dry_runs = [outcome for caller in CALLERS for outcome in results[caller]]
    log_bytes = daemon.log_path.stat().st_size
    peak = int(Path(cgroup["memory"]).read_text()) if Path(cgroup["memory"]).exists() else 0
    print(
        f"\n/status from another member: {len(latencies)} requests, median {statistics.median(latencies) * 1000:.0f} ms,"
        f" p99 {p99 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms\n"
        f"dry runs ({len(CALLERS)} members, {len(dry_runs)} done): statuses {sorted({s for s, _ in dry_runs})},"
        f" median {statistics.median([t for _, t in dry_runs]):.1f} s\n"
        f"attack (connections opened per listener): {results['attack']}\n"
        f"daemon: RSS max {stats['rss'] / 2**20:.0f} MiB, threads max {stats['threads']}, fds max {stats['fds']},"
        f" log {log_bytes / 1024:.0f} KiB; cgroup memory peak {peak / 2**20:.0f} MiB;"
        f" load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    assert daemon.proc.poll() is None, daemon.log()[-3000:]
    assert p99 < 0.250
    assert stats["rss"] < 500 * 2**20 and stats["threads"] < 100 and log_bytes < 10 * 10**6
    assert dry_runs and all(status == 200 for status, _ in dry_runs), dry_runs
    daemon.stop(signal.SIGKILL)
