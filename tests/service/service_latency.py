"""Many concurrent requests to the daemon's control socket, each timed (the 200-status-requests check)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx


async def _timed_requests(socket_path: Path, count: int, path: str) -> tuple[list[float], list[str]]:
    transport = httpx.AsyncHTTPTransport(uds=str(socket_path), limits=httpx.Limits(max_connections=count))
    async with httpx.AsyncClient(transport=transport, base_url="http://appliance", timeout=60) as client:
        start = asyncio.Event()

        async def one() -> float | str:
            await start.wait()
            began = time.perf_counter()
            try:
                response = await client.get(path)
            except httpx.HTTPError as error:
                return f"{type(error).__name__}: {error}"
            if response.status_code != 200:
                return f"HTTP {response.status_code}: {response.text[:200]}"
            return time.perf_counter() - began

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        await asyncio.sleep(0)
        start.set()
        results = await asyncio.gather(*tasks)
    return [r for r in results if isinstance(r, float)], [r for r in results if isinstance(r, str)]


def concurrent_status_requests(socket_path: Path, count: int = 200, path: str = "/status"):
    """(latencies in seconds of the answered requests, errors) for `count` requests sent at once."""
    return asyncio.run(_timed_requests(Path(socket_path), count, path))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]
