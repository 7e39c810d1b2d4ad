"""Many concurrent requests to the daemon's control socket, each timed (the 200-status-requests check).

The client is raw asyncio on the Unix socket (one connection per request,
HTTP/1.1 with Connection: close), so the times measure the daemon rather than
a client library's per-request overhead.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path


async def _one(socket_path: str, path: str, start: asyncio.Event) -> float | str:
    await start.wait()
    began = time.perf_counter()
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: appliance\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read()
        writer.close()
        await writer.wait_closed()
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    status_line = response.split(b"\r\n", 1)[0]
    if not status_line.startswith(b"HTTP/1.1 200"):
        return f"{status_line.decode(errors='replace')}: {response[-200:]!r}"
    return time.perf_counter() - began


async def _timed_requests(socket_path: Path, count: int, path: str) -> tuple[list[float], list[str]]:
    start = asyncio.Event()
    tasks = [asyncio.create_task(_one(str(socket_path), path, start)) for _ in range(count)]
    await asyncio.sleep(0.1)  # every task waits at the start line
    start.set()
    results = await asyncio.gather(*tasks)
    return [r for r in results if isinstance(r, float)], [r for r in results if isinstance(r, str)]


def concurrent_status_requests(socket_path: Path, count: int = 200, path: str = "/status"):
    """(latencies in seconds of the answered requests, errors) for `count` requests sent at once."""
    return asyncio.run(_timed_requests(Path(socket_path), count, path))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]
