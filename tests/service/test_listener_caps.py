"""Every listener is capped (appliance/http_listener.py): one peer's idle or half-sent connections never keep
another peer out, heads and bodies must arrive in time and in size, idle connections are closed, no thread is
started per connection, and accept failures at the descriptor limit are logged once per interval."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.engines.openai_server import ENDPOINT_LIMITS, serve_app_in_thread
from appliance.http_listener import ListenerLimits, serve_guarded
from appliance.metrics import TrainingMetrics, serve_metrics
from appliance.service.daemon import MAX_TRAJECTORY_BODY_BYTES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def hello(scope, receive, send) -> None:
    """The smallest ASGI app: reads the body, answers 200 "hello"."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture
def serve():
    started = []

    def start(limits: ListenerLimits, app=hello):
        running = serve_guarded(app, "127.0.0.1", 0, limits, name="test")
        started.append(running)
        return int(running.url.rsplit(":", 1)[1])

    yield start
    for running in started:
        running.close(timeout_seconds=10)


def connect(port: int, source: str = "127.0.0.1", send: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    if send:
        sock.sendall(send)
    return sock


def get(port: int, source: str = "127.0.0.1", path: str = "/") -> tuple[int, float]:
    """(status, seconds) of one GET from `source`."""
    started = time.monotonic()
    with connect(port, source, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()) as sock:
        answer = sock.recv(4096)
    return int(answer.split(b" ")[1]), time.monotonic() - started


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed `sock` within `seconds`, and what it sent first."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
        return True, data
    except (socket.timeout, TimeoutError):
        return False, data
    except ConnectionResetError:
        return True, data


def test_one_peers_idle_and_half_sent_connections_never_keep_another_peer_out(serve):
    port = serve(ListenerLimits(total=32, per_peer=8, head_seconds=30))
    held = []
    for attacker in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
        for number in range(100):  # idle ones and half-sent heads, far past the per-peer and total caps
            held.append(connect(port, attacker, b"POST /x HTTP/1.1\r\nHost: x\r\n" if number % 2 else b""))
    time.sleep(0.5)
    latencies = [get(port, "127.0.0.9") for _ in range(20)]
    assert all(status == 200 for status, _ in latencies)
    assert max(seconds for _, seconds in latencies) < 0.5, latencies
    alive = sum(not closed_within(sock, 0.01)[0] for sock in held)
    assert alive <= 32, f"{alive} attacker connections still open past the total cap"
    for sock in held:
        sock.close()


async def refuse_unread(scope, receive, send) -> None:
    """An app that answers 401 without reading the body: a token check before the route (the TCP control port,
    a job's student endpoint) or a page that takes no body (the metrics port)."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"no"})


def test_bodies_nobody_reads_from_many_addresses_never_keep_another_peer_out(serve):
    """An outside account sends from every address of 127.0.0.0/8, one connection each, a body trickling in after
    its refusal: before, such a connection counted as a request in flight and 400 of them kept everyone out."""
    port = serve(ListenerLimits(total=32, per_peer=8), app=refuse_unread)
    held = []
    for number in range(200):
        sock = connect(port, f"127.0.{1 + number // 250}.{2 + number % 250}")
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
        held.append(sock)
    time.sleep(0.5)
    for sock in held:  # still trickling: not idle, not half-sent
        with contextlib.suppress(OSError):
            sock.send(b" ")
    answers = [refused_or_answered(port, "127.0.9.9") for _ in range(10)]
    assert answers == [401] * 10, answers
    assert sum(map(established, held)) <= 32
    for sock in held:
        sock.close()


def refused_or_answered(port: int, source: str) -> int:
    with connect(port, source, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") as sock:
        return int(sock.recv(4096).split(b" ")[1])


async def long_poll(scope, receive, send) -> None:
    """An app that answers after 4 s (the events long-poll, shortened)."""
    if scope["type"] == "http":
        await asyncio.sleep(4)
        await hello(scope, receive, send)


def test_requests_in_flight_from_a_few_peers_never_keep_another_out(serve):
    port = serve(ListenerLimits(total=24, per_peer=8), app=long_poll)
    held = [
        connect(port, f"127.0.0.{2 + n % 3}", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") for n in range(24)
    ]  # three peers, eight long-polls each: the listener is full of requests in flight
    time.sleep(0.5)
    newcomer = connect(port, "127.0.0.9", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    newcomer.settimeout(2)
    with pytest.raises((socket.timeout, TimeoutError)):
        newcomer.recv(100)  # admitted and waiting for its own answer, not refused with a 503
    assert sum(map(established, held)) == 23  # one of the biggest peer's was cut to make room
    for sock in held + [newcomer]:
        sock.close()


def test_a_head_must_arrive_in_time_and_in_size(serve):
    port = serve(ListenerLimits(head_seconds=1.0, max_head_bytes=8192))
    silent = connect(port)
    half = connect(port, send=b"GET / HTTP/1.1\r\nHost: x\r\n")
    closed, said = closed_within(silent, 3)
    assert closed and said == b""  # never sent a byte: closed without an answer
    closed, said = closed_within(half, 3)
    assert closed and said.startswith(b"HTTP/1.1 408")
    huge = connect(port, send=b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20000)
    closed, said = closed_within(huge, 3)
    assert closed and said.startswith(b"HTTP/1.1 431")
    assert get(port)[0] == 200


def test_a_stalled_body_and_an_idle_keep_alive_are_cut(serve):
    port = serve(ListenerLimits(body_seconds=1.0, idle_seconds=1.0, head_seconds=5.0))
    stalled = connect(port, send=b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
    started = time.monotonic()
    closed, _ = closed_within(stalled, 4)
    assert closed and time.monotonic() - started < 3
    kept = connect(port, send=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept.recv(4096).startswith(b"HTTP/1.1 200")
    closed, _ = closed_within(kept, 3)  # keep-alive, then nothing: closed after idle_seconds
    assert closed


async def websocket_echo(scope, receive, send) -> None:
    """An app that would hold a WebSocket open for ever (the listener must never hand it one), else `hello`."""
    if scope["type"] != "websocket":
        return await hello(scope, receive, send)
    await receive()
    await send({"type": "websocket.accept"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


@pytest.mark.parametrize("protocol", ["websocket", "WebSocket", "h2c"])
def test_no_connection_is_upgraded_out_of_the_listeners_caps(serve, protocol):
    port = serve(ListenerLimits(total=8, per_peer=4, head_seconds=1.0, idle_seconds=1.0), app=websocket_echo)
    upgrade = (
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: {}\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).format(protocol)
    held = [connect(port, send=upgrade.encode()) for _ in range(6)]
    for sock in held:
        closed, said = closed_within(sock, 4)  # answered as plain HTTP, then cut when idle like any connection
        assert said.startswith(b"HTTP/1.1 200") and closed
    for sock in held:
        sock.close()
    # None of them stays counted: a peer that upgraded and left is not refused for ever after.
    assert wait_for_status(port, 200)


def wait_for_status(port: int, status: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(get(port)[0] == status for _ in range(6)):
            return True
        time.sleep(0.2)
    return False


def answers_to_pipeline(port: int, depth: int) -> tuple[int, bool]:
    """(answers read, whether the server closed) after `depth` GETs sent in one write on one connection."""
    sock = connect(port, send=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * depth)
    closed, said = closed_within(sock, 3)
    sock.close()
    return said.count(b"HTTP/1.1 200"), closed


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.one_of(st.integers(1, 9), st.integers(10, 20_000)))
def test_a_peer_pipelining_thousands_of_requests_is_dropped_not_queued(serve, depth):
    port = serve(ListenerLimits(max_pipelined=8, idle_seconds=1.0, head_seconds=1.0))
    answered, closed = answers_to_pipeline(port, depth)
    if depth <= 9:  # the one answered and max_pipelined behind it: an honest pipelining client
        assert answered == depth
    else:  # never more than max_pipelined parsed and queued at once, whatever one write holds
        assert answered <= 9 and closed
    assert get(port)[0] == 200


RECEIVED: list[int] = []  # body bytes the counting app was handed, per request


async def counting(scope, receive, send) -> None:
    """Reads the body to its end, counting what it is handed, then answers 200."""
    if scope["type"] != "http":
        return
    RECEIVED.append(0)
    while True:
        message = await receive()
        RECEIVED[-1] += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def post(port: int, size: int, chunked: bool, piece: int) -> bytes:
    """What the server answers to a POST of `size` bytes, sent with Content-Length or chunked in `piece`s."""
    sock = connect(port)
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n\r\n")
    sent = 0
    try:
        while sent < size:
            part = min(piece, size - sent)
            data = b"x" * part
            sock.sendall(b"%x\r\n%s\r\n" % (part, data) if chunked else data)
            sent += part
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused mid-body: the answer is already there
    _closed, said = closed_within(sock, 3)
    sock.close()
    return said


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 300_000), chunked=st.booleans(), piece=st.sampled_from([1000, 65536]))
def test_a_body_past_the_listeners_cap_is_refused_however_it_is_framed(serve, size, chunked, piece):
    port = serve(ListenerLimits(max_body_bytes=100_000, body_seconds=5.0, head_seconds=0.5), app=counting)
    RECEIVED.clear()
    said = post(port, size, chunked, piece)
    assert all(count <= 100_000 for count in RECEIVED)  # the app never holds more than the cap
    assert said.startswith(b"HTTP/1.1 413" if size > 100_000 else b"HTTP/1.1 200"), said[:80]
    assert get(port)[0] == 200


async def slow_hello(scope, receive, send) -> None:
    """`hello`, after two seconds at /slow (a long poll, a slow page): the peer sends on meanwhile."""
    if scope["type"] == "http" and scope["path"] == "/slow":
        await asyncio.sleep(2.0)
    await hello(scope, receive, send)


AFTER_A_HEAD = {  # what follows a complete head; the parser keeps each in memory until it ends
    "endless trailers": (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n", b"X-T: aaaa\r\n"),
    "one endless trailer": (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: ", b"a"),
    "an endless next head": (b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nX-Long: ", b"a"),
}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from(sorted(AFTER_A_HEAD)), piece=st.sampled_from([4096, 65536]))
def test_what_follows_a_head_is_bounded_however_it_is_framed(serve, shape, piece):
    """The attack: 616 MB of chunked-body trailers in 8 s took a listener from 29 MB to 2.4 GB (any listener,
    the metrics port included): a trailer, or a head sent during a slow answer, was counted nowhere."""
    port = serve(ListenerLimits(max_body_bytes=100_000, max_head_bytes=8192, body_seconds=30.0), app=slow_hello)
    head, unit = AFTER_A_HEAD[shape]
    sock = connect(port, send=head)
    block, sent = unit * (piece // len(unit)), 0
    try:
        while sent < 64 * 2**20:  # far past any kernel buffer: the server must stop taking it
            sock.sendall(block)
            sent += len(block)
    except (BrokenPipeError, ConnectionResetError, socket.timeout, TimeoutError):
        pass
    sock.close()
    assert sent < 64 * 2**20, f"the listener took {sent >> 20} MiB after one head"
    assert get(port)[0] == 200


async def big_page(scope, receive, send) -> None:
    """An app whose every answer is 8 MiB (a long page of a log)."""
    if scope["type"] != "http":
        return
    body = b"x" * (8 << 20)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def test_answers_a_peer_does_not_read_are_dropped_and_never_pile_up(serve):
    port = serve(ListenerLimits(write_seconds=2.0, max_unread_bytes=8 << 20), app=big_page)
    readers = []
    for _ in range(12):  # twelve 8 MiB pages asked for, none read
        sock = connect(port, "127.0.0.2", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        readers.append(sock)
        time.sleep(0.05)
    time.sleep(0.5)
    # each unread answer holds what the kernel did not take of its 8 MiB (several MiB): 8 MiB of them are kept
    assert sum(map(established, readers)) <= 4, "unread answers kept past max_unread_bytes"
    assert get(port, "127.0.0.3")[0] == 200  # another peer is answered meanwhile
    time.sleep(2.5)
    assert not any(map(established, readers)), "an unread answer outlived write_seconds"
    for sock in readers:
        sock.close()


def established(sock: socket.socket) -> bool:
    """The connection is still up (TCP_INFO's state, read without reading the socket's data)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 1  # TCP_ESTABLISHED


def test_the_metrics_port_holds_a_thousand_connections_on_one_thread():
    server = serve_metrics(TrainingMetrics(version="t", student_model="m", judge_model=None), "127.0.0.1", 0)
    try:
        before = threading.active_count()
        held = [connect(server.port, f"127.0.1.{1 + number % 200}") for number in range(1000)]
        time.sleep(0.5)
        with urllib.request.urlopen(server.url, timeout=5) as response:
            assert b"appliance_train_steps_total" in response.read()
        assert threading.active_count() - before <= 1, "threads grew with the connections"
        open_ones = sum(not closed_within(sock, 0.005)[0] for sock in held)
        assert open_ones <= 128, f"{open_ones} connections open past the metrics port's cap of 128"
        for sock in held:
            sock.close()
    finally:
        server.close()


def test_a_jobs_student_endpoint_is_capped_the_same_way():
    running = serve_app_in_thread(hello, "127.0.0.1", 0)
    try:
        port = int(running.url.removesuffix("/v1").rsplit(":", 1)[1])
        held = []
        for _ in range(3):  # the peer's stale half-sent connections make way for its newer ones
            held += [connect(port, "127.0.0.2", b"POST /v1/chat HTTP/1.1\r\n") for _ in range(ENDPOINT_LIMITS.per_peer)]
            time.sleep(ENDPOINT_LIMITS.fresh_seconds + 0.2)
        assert get(port, "127.0.0.3")[0] == 200
        assert sum(map(established, held)) <= ENDPOINT_LIMITS.per_peer
        for sock in held:
            sock.close()
        # A body past its cap is refused from its declared length, and what the daemon forwards always fits.
        over = ENDPOINT_LIMITS.max_body_bytes + 1
        big = connect(
            port, "127.0.0.4", b"POST /v1/trajectories HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % over
        )
        assert closed_within(big, 3)[1].startswith(b"HTTP/1.1 413")
        assert MAX_TRAJECTORY_BODY_BYTES <= ENDPOINT_LIMITS.max_body_bytes
    finally:
        running.close(timeout_seconds=10)


ACCEPT_STORM = textwrap.dedent(
    """
    import logging, os, resource, sys, time
    from appliance.http_listener import ListenerLimits, serve_guarded
    from tests.service.test_listener_caps import hello
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    running = serve_guarded(hello, "127.0.0.1", 0, ListenerLimits(), name="storm")
    print(running.url.rsplit(":", 1)[1], flush=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hoard = []
    try:
        while True:  # every descriptor taken: accept() fails with EMFILE from now on
            hoard.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    sys.stdin.readline()  # the test floods the port meanwhile
    for fd in hoard:
        os.close(fd)
    time.sleep(1.5)  # asyncio retries accept a second after EMFILE
    sys.stdin.readline()
    """
)


def test_accept_failures_at_the_descriptor_limit_are_logged_once_and_serving_resumes():
    proc = subprocess.Popen(
        [sys.executable, "-c", ACCEPT_STORM],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_NOFILE, (256, 256)),
    )
    try:
        port = int(proc.stdout.readline())
        for _ in range(400):
            try:
                connect(port).close()
            except OSError:
                pass
        time.sleep(2.5)
        proc.stdin.write("\n")
        proc.stdin.flush()
        time.sleep(2.0)
        assert get(port)[0] == 200, "serving did not resume once descriptors were free"
        proc.stdin.write("\n")
        proc.stdin.flush()
        _, errors = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    accept_lines = [line for line in errors.splitlines() if "accept" in line.lower()]
    assert 1 <= len(accept_lines) <= 3, errors[-3000:]
    assert len(errors) < 20_000
