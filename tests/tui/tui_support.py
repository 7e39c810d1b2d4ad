"""Helpers for the TUI's Pilot tests: wait while the app runs, read what the terminal shows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest


async def until(pilot, condition: Callable[[], bool], what: str, timeout: float) -> float:
    """Let the app run until condition() holds; the seconds it took, or a failure naming what never happened."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"after {timeout:.0f}s: {what}\n--- screen ---\n{screen_text(pilot.app)}")
        await pilot.pause(0.2)
    return time.monotonic() - started


async def in_thread(call, *args):
    """A blocking client call from a test's event loop."""
    return await asyncio.to_thread(call, *args)


def screen_text(app) -> str:
    """What the terminal shows now, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def widget_text(app, selector: str) -> str:
    """What the terminal shows now inside one widget's region."""
    region = app.screen.query_one(selector).region
    lines = screen_text(app).splitlines()[region.y : region.y + region.height]
    return "\n".join(line[region.x : region.x + region.width] for line in lines)
