"""`appliance serve`: the control socket (0660 from the moment it exists), uvicorn, the metrics port, signals, sd_notify.

The socket is bound inside a fresh 0700 folder next to its final path, given
its group and mode there, and renamed into place: no one ever sees it with
other permissions (uvicorn's own `uds=` would chmod it to 0666). Each
connection's SO_PEERCRED (pid, uid, gid) is read once in the HTTP protocol's
connection_made and put in the ASGI scope's state, where control.py finds it.

`--control-addr HOST:PORT` (only with a token file) adds a TCP listener to
the same app: a TCP connection has no SO_PEERCRED, so its state carries the
remote address instead, and control.py answers it only with the bearer token.

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
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from appliance.service.daemon import Daemon, DaemonError, DaemonOptions

DEFAULT_GROUP = "appliance"
_UCRED = struct.Struct("3i")  # Linux's struct ucred: pid, uid, gid


def peer_credentials(transport) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the process on the other end of a Unix-socket transport; None if unreadable."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None


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


class PeerCredProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, with the peer's credentials in every request's scope["state"]["peer"]
    (Unix socket) or its address in scope["state"]["remote"] (TCP)."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.app_state = {**self.app_state, "peer": peer_credentials(transport), "remote": tcp_remote(transport)}


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon decides what SIGTERM does."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def resolve_group(name: str | None) -> int:
    """The socket's group: --group, else 'appliance' when it exists, else the daemon's own group."""
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
    daemon.bus.loop = loop
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # proxy_headers off: X-Forwarded-For must never stand in for the address the audit log records.
    config = uvicorn.Config(
        create_app(daemon, control_token=control_token, admin_gid=admin_gid),
        http=PeerCredProtocol,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        proxy_headers=False,
    )
    server = _Server(config)
    daemon.supervisor.start()
    serving = asyncio.create_task(server.serve(sockets=[sock] + ([tcp] if tcp is not None else [])))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if serving.done():
        serving.result()
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
    server.should_exit = True
    await serving
    if watchdog:
        watchdog.cancel()


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
