"""`appliance serve`: the control socket (0660 from the moment it exists), uvicorn, the metrics port, signals, sd_notify.

The socket is bound inside a fresh 0700 folder next to its final path, given
its group and mode there, and renamed into place: no one ever sees it with
other permissions (uvicorn's own `uds=` would chmod it to 0666). Each
connection's SO_PEERCRED (pid, uid, gid) and SO_PEERGROUPS (its supplementary
groups) are read once in the HTTP protocol's connection_made and put in the
ASGI scope's state, where control.py finds them: they hold when the peer is in
another PID namespace (pid 0) and cannot change under a reused pid.

`--control-addr HOST:PORT` (only with a token file) adds a TCP listener to
the same app: a TCP connection has no SO_PEERCRED, so its state carries the
remote address instead, and control.py answers it only with the bearer token.
Every listener is capped (appliance/http_listener.py); what the TCP port saw
before any token was checked is audited in one summary line per peer and window.

SIGTERM/SIGINT: STOPPING=1, the running jobs checkpoint at the end of their
step (bounded by the stop timeout, else the last checkpoint stands) and are
marked interrupted, the API stops, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import signal
import socket
import stat
import struct
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import uvicorn

from appliance.http_listener import (
    SUMMARY_SECONDS,
    ConnectionGate,
    GuardedProtocol,
    ListenerLimits,
    fit_caps,
    guarded_protocol,
    quiet_errors,
    raise_nofile_limit,
)
from appliance.service.daemon import Daemon, DaemonError, DaemonOptions

DEFAULT_GROUP = "appliance"
_UCRED = struct.Struct("3i")  # Linux's struct ucred: pid, uid, gid
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux's value; Python names it only from 3.12
MAX_PEER_GROUPS = 256  # getsockopt returns at most 1024 bytes: 256 group ids
# The share of the descriptors each listener may hold at its cap (the metrics port has its own thread).
SOCKET_LIMITS = ListenerLimits(total=512, per_peer=64)
TCP_LIMITS = ListenerLimits(total=256, per_peer=32)


def peer_credentials(transport) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the process on the other end of a Unix-socket transport; None if unreadable."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None


def peer_groups(transport) -> tuple[int, ...]:
    """The supplementary groups of the process on the other end of a Unix socket, as the kernel recorded them
    at connect time (SO_PEERGROUPS); () when they cannot be read."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return ()
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * MAX_PEER_GROUPS)
    except OSError:
        return ()
    return struct.unpack(f"{len(data) // 4}I", data[: len(data) // 4 * 4])


def tcp_remote(transport) -> str | None:
    """'host:port' of the other end of a TCP transport (read from the connection, never from headers)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    peer = transport.get_extra_info("peername")
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class PeerCredProtocol(GuardedProtocol):
    """The capped HTTP protocol, with the peer's credentials and groups in every request's scope["state"]
    ("peer", "groups": Unix socket) or its address ("remote": TCP)."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        credentials = peer_credentials(transport)
        self.app_state = {
            **self.app_state,
            "peer": credentials,
            "groups": peer_groups(transport) if credentials else (),
            "remote": tcp_remote(transport),
        }
        super().connection_made(transport)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon decides what SIGTERM does."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def resolve_group(name: str | None) -> int:
    """The socket's group: --group (a name or number), else 'appliance' when it exists, else the daemon's own."""
    if name and name.isdigit():
        return int(name)
    if name:
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            raise DaemonError(f"--group {name}: no such group; create it (groupadd {name}) or name another") from None
    try:
        return grp.getgrnam(DEFAULT_GROUP).gr_gid
    except KeyError:
        return os.getgid()


def resolve_admin_group(name: str) -> int:
    """--admin-group: a group name or number whose members may act on every job."""
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise DaemonError(f"--admin-group {name}: no such group; create it (groupadd {name}) or name another") from None


def bind_control_socket(path: Path, gid: int, mode: int = 0o660) -> socket.socket:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise DaemonError(f"--socket {path} exists and is not a socket; remove it or choose another path")
        # Something answers at the path: another daemon. Nothing answers: a dead daemon's socket, removed.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise DaemonError(f"a daemon already listens on {path}; stop it or pass another --socket")
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # stale socket of a daemon that died
        finally:
            probe.close()
    staging = Path(tempfile.mkdtemp(prefix=".control-", dir=path.parent))  # mode 0700
    temporary = staging / "socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(temporary))
        try:
            os.chown(temporary, -1, gid)
        except PermissionError:
            raise DaemonError(
                f"cannot give the socket group id {gid}: the daemon is neither root nor in that "
                "group; run it as root or pass --group with one of its groups"
            ) from None
        os.chmod(temporary, mode)
        os.rename(temporary, path)  # the socket appears at its path already with its group and mode
        sock.listen(256)
        sock.setblocking(False)
        return sock
    except BaseException:
        sock.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
        with contextlib.suppress(OSError):
            staging.rmdir()


def bind_control_tcp(host: str, port: int) -> socket.socket:
    """The optional TCP control listener (the caller checked that a token file goes with it)."""
    try:
        family, _type, _proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise DaemonError(f"--control-addr {host}:{port}: cannot resolve '{host}' ({error.strerror})") from None
    try:
        sock = socket.create_server(address, family=family, backlog=256)
    except OSError as error:
        raise DaemonError(
            f"--control-addr {host}:{port}: cannot listen there ({error.strerror}); "
            "choose a free port on an address of this machine"
        ) from None
    sock.setblocking(False)
    return sock


class Notifier:
    """systemd's sd_notify protocol: a datagram to $NOTIFY_SOCKET (an '@' name is in the abstract namespace)."""

    def __init__(self, environ=os.environ):
        address = environ.get("NOTIFY_SOCKET")
        self.address = "\0" + address[1:] if address and address.startswith("@") else address
        usec = environ.get("WATCHDOG_USEC")
        owner = environ.get("WATCHDOG_PID")
        mine = owner is None or owner == str(os.getpid())  # a watchdog meant for another process is not ours
        # Pinged at half the watchdog's interval (microseconds), as sd_watchdog_enabled(3) advises.
        self.watchdog_seconds = int(usec) / 2e6 if usec and usec.isdigit() and int(usec) > 0 and mine else None

    def send(self, message: str) -> None:
        if not self.address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(message.encode(), self.address)
            except OSError as error:
                print(f"appliance serve: sd_notify to {self.address!r} failed: {error}", file=sys.stderr)


async def _serve(
    daemon: Daemon,
    sock: socket.socket,
    socket_path: Path,
    notifier: Notifier,
    stop_timeout: float,
    tcp: socket.socket | None = None,
    control_token: str | None = None,
    admin_gid: int | None = None,
) -> None:
    from appliance.service.control import create_app

    loop = asyncio.get_running_loop()
    quiet_errors(loop)
    daemon.bus.loop = loop
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = create_app(daemon, control_token=control_token, admin_gid=admin_gid)
    gates = _control_gates(daemon, tcp is not None)
    servers = [_server(app, gate) for gate in gates]
    daemon.supervisor.start()
    daemon.start_housekeeping()
    serving = [
        asyncio.create_task(server.serve(sockets=[listener]))
        for server, listener in zip(servers, [sock] + ([tcp] if tcp is not None else []))
    ]
    summaries = asyncio.create_task(_summaries(gates))
    while not all(server.started for server in servers) and not any(task.done() for task in serving):
        await asyncio.sleep(0.02)
    for task in serving:
        if task.done():
            task.result()
            return
    print(f"appliance serve: control API on {socket_path}", file=sys.stderr, flush=True)
    if tcp is not None:
        host, port = tcp.getsockname()[:2]
        print(
            f"appliance serve: control API also on TCP {host}:{port} (bearer token required)",
            file=sys.stderr,
            flush=True,
        )
    notifier.send("READY=1")
    watchdog = asyncio.create_task(_watchdog(notifier)) if notifier.watchdog_seconds else None
    await stop.wait()
    notifier.send("STOPPING=1")
    print("appliance serve: stopping; running jobs checkpoint at the end of their step", file=sys.stderr, flush=True)
    await asyncio.to_thread(daemon.supervisor.shutdown, stop_timeout)
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*serving)
    summaries.cancel()
    for gate in gates:
        _flush(gate)
    if watchdog:
        watchdog.cancel()


def _control_gates(daemon: Daemon, with_tcp: bool) -> list[ConnectionGate]:
    """The caps of the control socket and, when asked, of the TCP control port."""
    # The listener's body cap is the largest route's (a submission's, with its upload); routes hold their own.
    largest = max(daemon.submit_body_limit, daemon.trajectory_body_limit)
    gates = [ConnectionGate("control socket", replace(fit_caps(SOCKET_LIMITS, 0.5), max_body_bytes=largest))]
    if with_tcp:
        limits = replace(fit_caps(TCP_LIMITS, 0.25), max_body_bytes=largest)
        gates.append(ConnectionGate("control port", limits, on_summary=_audit_summary(daemon)))
    return gates


def _server(app, gate: ConnectionGate) -> "_Server":
    """One uvicorn server of `app` for one listener, under `gate`."""
    # proxy_headers off: X-Forwarded-For must never stand in for the address the audit log records.
    config = uvicorn.Config(
        app,
        http=guarded_protocol(gate, PeerCredProtocol),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(gate.limits.idle_seconds),
        proxy_headers=False,
    )
    return _Server(config)


def _audit_summary(daemon: Daemon):
    """Audit what one TCP peer did in a window before any token was checked (connections, not requests)."""

    def write(summary: dict) -> None:
        counts = ", ".join(
            f"{summary[key]} {key}" for key in ("opened", "refused", "evicted", "timed_out") if key in summary
        )
        peer = summary["peer"]
        daemon.audit.chatter(
            ("tcp", str(peer[1] if isinstance(peer, tuple) else peer)),
            uid=None,
            pid=None,
            action="connections",
            job_id=None,
            outcome=f"{counts} since {summary['since']:.0f}",
            transport="tcp",
            remote=str(peer[1] if isinstance(peer, tuple) else peer),
        )

    return write


async def _summaries(gates: list[ConnectionGate]) -> None:
    while True:
        await asyncio.sleep(SUMMARY_SECONDS)
        for gate in gates:
            found = gate.flush()  # on the loop, which alone counts into the gate
            await asyncio.to_thread(_write, gate, found)


def _flush(gate: ConnectionGate) -> None:
    _write(gate, gate.flush())


def _write(gate: ConnectionGate, summaries: list[dict]) -> None:
    for summary in summaries:
        if gate.on_summary is not None:
            gate.on_summary(summary)


async def _watchdog(notifier: Notifier) -> None:
    while True:
        notifier.send("WATCHDOG=1")
        await asyncio.sleep(notifier.watchdog_seconds)


def run_daemon(
    options: DaemonOptions,
    socket_path: Path,
    group: str | None,
    metrics_host: str,
    metrics_port: int,
    control_addr: tuple[str, int] | None = None,
    control_token_file: Path | None = None,
    admin_group: str | None = None,
) -> int:
    from appliance.metrics.scrape_server import serve_metrics
    from appliance.service.token_file import read_token_file

    if control_addr is not None and control_token_file is None:
        raise DaemonError(
            "--control-addr needs --control-token-file FILE: the TCP control port answers only "
            "requests carrying that file's token"
        )
    if control_token_file is not None and control_addr is None:
        raise DaemonError("--control-token-file is used only with --control-addr HOST:PORT; add one or drop it")
    control_token = read_token_file(control_token_file) if control_token_file is not None else None
    raise_nofile_limit()  # before any listener: the caps are sized from it
    gid = resolve_group(group)
    admin_gid = resolve_admin_group(admin_group) if admin_group else None
    daemon = Daemon(options)
    metrics_server = sock = tcp = None
    try:
        metrics_server = serve_metrics(daemon.metrics, metrics_host, metrics_port)
        print(f"appliance serve: Prometheus metrics on {metrics_server.url}", file=sys.stderr, flush=True)
        sock = bind_control_socket(socket_path, gid)
        tcp = bind_control_tcp(*control_addr) if control_addr is not None else None
        asyncio.run(
            _serve(daemon, sock, Path(socket_path), Notifier(), options.stop_timeout, tcp, control_token, admin_gid)
        )
    except OSError as error:
        raise DaemonError(f"cannot start serving: {error}") from error
    finally:
        if tcp is not None:
            tcp.close()
        if sock is not None:
            sock.close()
            with contextlib.suppress(OSError):
                Path(socket_path).unlink()
        if metrics_server is not None:
            metrics_server.close()
        daemon.close()
    print("appliance serve: stopped", file=sys.stderr, flush=True)
    return 0
