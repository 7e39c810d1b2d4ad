"""SVG snapshots of the jobs, job, compare and device screens at 80x24 and 120x40 (fixed data, frozen clock).

Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update`
and look at the report before committing the new SVGs.
"""

from __future__ import annotations

import pytest

from fixed import FixedApp

SIZES = [(80, 24), (120, 40)]


async def settle(pilot) -> None:
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
@pytest.mark.parametrize("screen", ["jobs", "job", "compare", "device"])
def test_screen(snap_compare, screen, size):
    assert snap_compare(FixedApp(screen), terminal_size=size, run_before=settle)
