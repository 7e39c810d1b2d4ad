"""Every HTTP listener of the appliance, capped: connections per peer and in total, time and bytes to send a
request head, time to send a body, idle keep-alive; errors logged once per interval.

One mechanism for the control socket, the TCP control port, the metrics port
and each job's student endpoint (uvicorn with `guarded_protocol(...)`):
- a connection beyond its peer's cap evicts that peer's oldest connection that
  has only been waiting (for a first request, or idle between requests) for
  `fresh_seconds` or more (a burst of fresh requests is let in while there is
  room); beyond the listener's total it evicts a waiting connection of the
  peer holding the most, or that peer's oldest outright when it holds more
  than the newcomer; with none to evict it is answered 503 and closed, so no
  peer's connections, idle, half-sent or long-polling, keep another peer out;
- no connection is upgraded (WebSocket or any other protocol): an `Upgrade`
  request is answered as plain HTTP, so every connection stays under its caps;
- at most `max_pipelined` requests wait parsed behind the one being answered
  on a connection; a peer pipelining more is dropped;
- a request body is at most `max_body_bytes` (declared or streamed, chunked
  included): past it the request is answered 413 and its connection closed,
  whatever the app would have buffered; what arrives between a head and the
  next wait (framing, trailers, a head sent early) at most twice that plus
  `max_head_bytes`;
- a request head must arrive within `head_seconds` of the connection (or of
  the previous answer) and within `max_head_bytes`; a body within
  `body_seconds` of its head; a connection idle after an answer is closed
  after `idle_seconds` (uvicorn's keep-alive timeout);
- an answer the peer does not read is dropped with its connection after
  `write_seconds`, and the answers waiting for one peer to read them hold at
  most `max_unread_bytes` (the oldest go first), so unread pages never pile up
  in memory;
- the process's RLIMIT_NOFILE is raised to its hard limit, and the caps are
  sized to fit under it (`fit_caps`).
A peer is a uid on a Unix socket (SO_PEERCRED), an address on TCP. What a
listener saw per window (connections opened, refused, evicted, timed out) is
handed to its `on_summary` (the TCP control port audits it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
import socket
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

RESERVED_FDS = 256  # descriptors kept for the job store, logs, workers' channels, exports
MAX_NOFILE = 65536  # the soft limit raised no higher: caps beyond it would be a typo
SUMMARY_SECONDS = 60.0
LOG_INTERVAL_SECONDS = 60.0
MAX_PEERS_COUNTED = 1024  # peers with their own line in a window's summary; the rest are summed
_UCRED = struct.Struct("3i")
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on with no linger: close() sends a reset, frees the send queue


@dataclass(frozen=True)
class ListenerLimits:
    total: int = 512
    per_peer: int = 64
    head_seconds: float = 10.0
    max_head_bytes: int = 64 * 1024
    body_seconds: float = 120.0
    idle_seconds: float = 5.0
    write_seconds: float = 30.0
    max_unread_bytes: int = 64 * 2**20
    fresh_seconds: float = 1.0  # a connection waiting less than this is a burst's, not evicted for its peer's cap
    max_pipelined: int = 16  # requests parsed and queued behind the one being answered, per connection
    max_body_bytes: int = 2**20  # one request's body; a route's own bound may be lower, never higher


class ConnectionGate:
    """The open connections of one listener, by peer; admits, evicts and counts."""

    def __init__(self, name: str, limits: ListenerLimits, on_summary: Callable[[dict], None] | None = None):
        self.name, self.limits, self.on_summary = name, limits, on_summary
        self.open: dict[Hashable, OrderedDict] = {}
        self.total = 0
        self.window: dict[Hashable, dict[str, int]] = {}
        self.window_start = time.time()

    def admit(self, connection) -> bool:
        """Count `connection` in (evicting a waiting one when a cap is reached); False: refuse it."""
        peer = connection.peer
        mine = self.open.get(peer, {})
        if len(mine) >= self.limits.per_peer:
            # Past its cap a peer's oldest stale connection makes way; a burst of fresh ones (a client sending
            # many requests at once) is let in while the listener has room, the total and its eviction bound it.
            self._evict_from(peer, min_age=self.limits.fresh_seconds)
        if self.total >= self.limits.total and not self._make_room(peer):
            self.note(peer, "refused")
            return False
        self.open.setdefault(peer, OrderedDict())[connection] = None
        self.total += 1
        self.note(peer, "opened")
        return True

    def stalled(self, connection) -> None:
        """`connection`'s answer waits for its peer to read it: while the peer's unread answers hold more than
        max_unread_bytes, its oldest unread answer is dropped with its connection."""
        waiting = sorted(
            (other for other in self.open.get(connection.peer, {}) if other.stalled_since is not None),
            key=lambda other: other.stalled_since,
        )
        unread = sum(other.transport.get_write_buffer_size() for other in waiting)
        for oldest in waiting:
            if unread <= self.limits.max_unread_bytes:
                return
            unread -= oldest.transport.get_write_buffer_size()
            self.note(oldest.peer, "unread")
            self.release(oldest)
            oldest.evict()

    def release(self, connection) -> None:
        mine = self.open.get(connection.peer)
        if mine is not None and connection in mine:
            del mine[connection]
            self.total -= 1
            if not mine:
                del self.open[connection.peer]

    def _largest_peer(self) -> Hashable:
        return max(self.open, key=lambda peer: len(self.open[peer]), default=None)

    def _make_room(self, newcomer: Hashable) -> bool:
        """At the total cap: evict a waiting connection of the peer holding the most; failing that, when that
        peer holds more than the newcomer would, its oldest connection even mid-request (long-polls, say), so a
        few peers can never keep the rest out."""
        # Waiting connections first, of the peers holding the most: many peers of one connection each (a host
        # can take every address of 127.0.0.0/8) are passed over by a look at the largest alone.
        for peer in sorted(self.open, key=lambda peer: len(self.open[peer]), reverse=True):
            if self._evict_from(peer):
                return True
        largest = self._largest_peer()
        if largest is None or len(self.open.get(largest, {})) <= len(self.open.get(newcomer, {})) + 1:
            return False
        oldest = next(iter(self.open[largest]))
        self.release(oldest)
        oldest.evict()
        self.note(largest, "evicted")
        return True

    def _evict_from(self, peer: Hashable, min_age: float = 0.0) -> bool:
        """Close the oldest connection of `peer` that has only been waiting for at least `min_age` seconds;
        False when it has none."""
        newest = time.monotonic() - min_age
        for connection in self.open.get(peer, {}):
            if connection.waiting_since is not None and connection.waiting_since <= newest:
                self.release(connection)
                connection.evict()
                self.note(peer, "evicted")
                return True
        return False

    def note(self, peer: Hashable, what: str) -> None:
        if isinstance(peer, tuple) and peer[0] == "host" and peer[1] is not None:
            peer = ("host", network_of(peer[1]))  # counted (and audited) per network, not per address
        if peer not in self.window and len(self.window) >= MAX_PEERS_COUNTED:
            peer = "others"
        counts = self.window.setdefault(peer, {})
        counts[what] = counts.get(what, 0) + 1

    def flush(self) -> list[dict]:
        """What each peer did since the last flush (one dict per peer), and a new window."""
        found = [
            {"listener": self.name, "peer": peer, "since": self.window_start, **counts}
            for peer, counts in self.window.items()
        ]
        self.window, self.window_start = {}, time.time()
        return found


class _PipelinedTooDeep(Exception):
    """Raised in the parser's callback to stop parsing a connection that pipelined too many requests."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol under a ConnectionGate (set on a subclass by `guarded_protocol`)."""

    gate: ConnectionGate

    def peer_of(self, transport) -> Hashable:
        return peer_key(transport)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # No listener serves WebSockets: an upgraded connection would leave this protocol, its caps and its count.
        self.ws_protocol_class = None
        self.peer, self.waiting_since, self.stalled_since = self.peer_of(transport), None, None
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._head_bytes, self._in_head, self._draining = 0, False, False
        self._body_bytes, self._busy_bytes, self._refused = 0, 0, False
        self.admitted = self.gate.admit(self)
        if not self.admitted:
            self._answer(503, "too many connections from this peer or to this listener; retry later")
            return
        self._await_head()

    def connection_lost(self, exc) -> None:
        self._cancel()
        if self._write_timer is not None:
            self._write_timer.cancel()
        if self.admitted:
            self.gate.release(self)
            self.admitted = False
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.waiting_since is not None and not self._draining:
            self._head_bytes += len(data)
            self._in_head = True
        else:
            # Everything after a head until the connection waits again: a body with its framing, trailers, the next
            # head sent early. The parser holds a trailer or a header in memory until it ends, so all count.
            self._busy_bytes += len(data)
            if self._busy_bytes > 2 * self.gate.limits.max_body_bytes + self.gate.limits.max_head_bytes:
                if not self._refused and not self.transport.is_closing():
                    self._refuse_body()
                return
        super().data_received(data)
        if self._in_head and self._head_bytes > self.gate.limits.max_head_bytes and not self.transport.is_closing():
            self._answer(431, f"the request head is over {self.gate.limits.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        self._message_done = False
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._refused:
            return  # a request after the one refused in the same read: the connection is closing
        if len(self.pipeline) >= self.gate.limits.max_pipelined:
            # Each queued request is parsed and held in memory: a peer sending thousands in one write is dropped,
            # and raising stops the parser short of the rest of the write.
            self.gate.note(self.peer, "pipelined")
            self.evict()
            raise _PipelinedTooDeep(f"over {self.gate.limits.max_pipelined} requests pipelined on one connection")
        self._cancel()
        self.waiting_since, self._in_head = None, False
        self._timer = self.loop.call_later(self.gate.limits.body_seconds, self._timed_out, 408)
        self._body_bytes = 0
        super().on_headers_complete()
        declared = [value for name, value in self.headers if name == b"content-length"]
        if declared and declared[-1].isdigit() and int(declared[-1]) > self.gate.limits.max_body_bytes:
            self._refuse_body()

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self.gate.limits.max_body_bytes:
            self._refuse_body()  # streamed past the cap (chunked, or a length that lied): nothing more is kept
            return
        super().on_body(body)

    def _refuse_body(self) -> None:
        """A body over max_body_bytes: the app sees a disconnect (its answer is dropped), the peer a 413."""
        self._refused = True
        self.pipeline.clear()
        started = self.cycle is not None and self.cycle.response_started
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.gate.note(self.peer, "too_large")
        if started:
            self.evict()
        else:
            self._answer(
                413, f"the request body is over this listener's limit of {self.gate.limits.max_body_bytes} bytes"
            )

    def on_message_complete(self) -> None:
        self._message_done = True
        self._cancel()
        if self._refused:
            return
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete and not self.pipeline:
            self._await_head()  # answered before its body ended (a 413): the next head starts now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next head is awaited once this request's body is in too (a body still arriving is not a head).
        idle = self.cycle is None or self.cycle.response_complete
        if self.transport.is_closing() or not idle:
            return
        if getattr(self, "_message_done", True):
            self._await_head()
        else:
            self._drain()

    def _drain(self) -> None:
        """Answered before its body ended (a refusal before the body was read: no token, too large): the rest of
        the body is read and dropped until it ends or the body's deadline, and the connection is only waiting, so
        a cap evicts it. A peer that trickles bodies nobody reads holds no place in the listener."""
        self.waiting_since, self._draining = time.monotonic(), True

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.stalled_since is None:
            self.stalled_since = time.monotonic()
            self._write_timer = self.loop.call_later(self.gate.limits.write_seconds, self._unread)
            self.gate.stalled(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.stalled_since = None
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _unread(self) -> None:
        self._write_timer = None
        self.gate.note(self.peer, "unread")
        self.evict()  # the peer has not read its answer in write_seconds: it is dropped

    def evict(self) -> None:
        """Close now with a reset: nothing more is sent, and the kernel drops what the peer left unread."""
        self._cancel()
        self.pipeline.clear()
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            except OSError:
                pass
        self.transport.abort()

    def _await_head(self) -> None:
        self._cancel()
        self.waiting_since, self._head_bytes, self._in_head, self._draining = time.monotonic(), 0, False, False
        self._busy_bytes = 0
        self._timer = self.loop.call_later(self.gate.limits.head_seconds, self._timed_out, 408)

    def _cancel(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, status: int) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self.waiting_since is None and self.flow is not None and self.flow.read_paused:
            # The app has not read the body yet (a submission waiting for its turn): the wait is ours, not a
            # slow client's. Look again later; the app's own bound (the turn's queue time) ends the wait.
            self._timer = self.loop.call_later(self.gate.limits.body_seconds, self._timed_out, status)
            return
        self.gate.note(self.peer, "timed_out")
        if self.cycle is not None and not self.cycle.response_complete and self.cycle.response_started:
            self.transport.abort()  # a body that stalled mid-request while the app answers: nothing more to say
            return
        if self._head_bytes or self.waiting_since is None:
            self._answer(status, "the request took too long to arrive")
        else:
            self.transport.close()  # never sent a byte: nothing to answer

    def _answer(self, status: int, message: str) -> None:
        """A short error answer, then the connection closed (the app never sees the request)."""
        reason = {
            408: "Request Timeout",
            413: "Content Too Large",
            431: "Request Header Fields Too Large",
            503: "Service Unavailable",
        }[status]
        body = ('{"error": "' + message + '"}').encode()
        head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        self.transport.write(head.encode() + b"connection: close\r\n\r\n" + body)
        self.transport.close()


def guarded_protocol(gate: ConnectionGate, base: type[GuardedProtocol] = GuardedProtocol) -> type:
    """A protocol class (uvicorn.Config's `http=`) for one listener, under `gate`."""
    return type(f"{base.__name__}For{gate.name.title().replace(' ', '')}", (base,), {"gate": gate})


def peer_key(transport) -> Hashable:
    """Who is on the other end: ("uid", uid) on a Unix socket (SO_PEERCRED), ("host", address) on TCP."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        try:
            _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            return ("uid", uid)
        except OSError:
            return ("uid", None)
    peer = transport.get_extra_info("peername")
    return ("host", peer[0] if peer else None)


def network_of(host: str) -> str:
    """Who an address counts as where a caller is counted (audit lines, turns, summaries): every loopback address
    is one (any local account can send from all of 127.0.0.0/8), an IPv6 address its /64 (a host is given a whole
    /64), an IPv4 address itself. "[::1]" and "host:port" forms are taken too; anything else is itself."""
    text = host.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.rsplit(":", 1)[0]
    try:
        address = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most MAX_NOFILE); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_NOFILE if hard == resource.RLIM_INFINITY else min(hard, MAX_NOFILE)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft


def fit_caps(limits: ListenerLimits, share: float) -> ListenerLimits:
    """`limits` with its total cut to `share` of the descriptors left after RESERVED_FDS (and its per-peer cap
    to the total), so every listener at its cap together stays under RLIMIT_NOFILE."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = max(8, int((soft - RESERVED_FDS) * share))
    total = min(limits.total, room)
    return ListenerLimits(**{**limits.__dict__, "total": total, "per_peer": min(limits.per_peer, total)})


class OncePerInterval(logging.Filter):
    """A log filter that lets each distinct message through once per interval, then one count of the rest."""

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS) -> None:
        super().__init__()
        self.interval = interval
        self._seen: dict[str, list] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = time.monotonic()
        with self._lock:
            if len(self._seen) > 1000:
                self._seen.clear()
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.interval:
                last[1] += 1
                return False
            if last is not None and last[1]:
                record.msg = f"{record.msg} ({last[1]} more like it in the last {self.interval:g} s)"
            self._seen[key] = [now, 0]
        return True


def quiet_errors(loop: asyncio.AbstractEventLoop, interval: float = LOG_INTERVAL_SECONDS) -> None:
    """Errors of `loop` (accept failing at the descriptor limit, ...) and of uvicorn logged once per interval."""
    limiter = OncePerInterval(interval)
    for name in ("uvicorn.error", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, OncePerInterval) for existing in logger.filters):
            logger.addFilter(limiter)

    def handler(loop, context) -> None:
        record = logging.LogRecord("asyncio", logging.ERROR, __file__, 0, context.get("message", "error"), None, None)
        if limiter.filter(record):
            context = {**context, "message": record.msg}
            context.pop("exception", None)  # one line, not a traceback per failed accept
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


@dataclass
class RunningServer:
    """A server started by `serve_guarded`: its URL and how to stop it."""

    url: str
    server: object
    thread: threading.Thread

    def close(self, timeout_seconds: float = 300.0) -> None:
        """Stop accepting, let requests in flight finish (a generation cannot be cut short), then return."""
        self.server.should_exit = True
        self.thread.join(timeout=timeout_seconds)


def serve_guarded(
    app, host: str = "127.0.0.1", port: int = 0, limits: ListenerLimits = ListenerLimits(), name: str = "http"
) -> RunningServer:
    """Serve an ASGI `app` on host:port (0: a free port) in one background thread (its own event loop; no
    thread per connection), under `limits`; returns once it accepts."""
    import uvicorn

    raise_nofile_limit()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()  # the port is taken: the caller may try another
        raise
    gate = ConnectionGate(name, fit_caps(limits, 0.25))
    config = uvicorn.Config(
        app,
        http=guarded_protocol(gate),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=int(limits.idle_seconds),
    )
    server = uvicorn.Server(config)

    def run() -> None:
        async def serve() -> None:
            quiet_errors(asyncio.get_running_loop())
            await server.serve(sockets=[sock])

        asyncio.run(serve())

    thread = threading.Thread(target=run, name=f"{name}-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"the {name} server did not start on {host}:{port}")
        time.sleep(0.02)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return RunningServer(f"http://{shown}:{bound_port}", server, thread)
