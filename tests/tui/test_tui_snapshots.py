"""SVG snapshots of the jobs, job, compare and device screens at 80x24 and 120x40 (fixed data, frozen clock).

Update after an intended change with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`
and look at the report before committing the new SVGs.
"""

from __future__ import annotations

import pytest

from tui_fixed import EXAMPLE, FixedApp

SIZES = [(80, 24), (120, 40)]


async def settle(pilot) -> None:
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
@pytest.mark.parametrize("screen", ["jobs", "job", "compare", "device"])
def test_screen(snap_compare, screen, size):
    assert snap_compare(FixedApp(screen), terminal_size=size, run_before=settle)


def test_confirm_modal_over_jobs(snap_compare):
    async def ask_to_cancel(pilot):
        await settle(pilot)
        await pilot.press("down", "x")
        await settle(pilot)

    assert snap_compare(FixedApp("jobs"), terminal_size=(80, 24), run_before=ask_to_cancel)


def test_help_over_job(snap_compare):
    async def ask_for_keys(pilot):
        await settle(pilot)
        await pilot.press("question_mark")
        await settle(pilot)

    assert snap_compare(FixedApp("job"), terminal_size=(80, 24), run_before=ask_for_keys)


def test_job_samples_tab(snap_compare):
    async def open_samples(pilot):
        await settle(pilot)
        await pilot.press("2")
        await settle(pilot)

    assert snap_compare(FixedApp("job"), terminal_size=(80, 24), run_before=open_samples)


@pytest.mark.parametrize("size", [(80, 40), (120, 40)], ids=lambda size: f"{size[0]}x{size[1]}")
def test_job_samples_tab_with_agent_trajectories(snap_compare, size):
    """Turns with role labels, tool calls and results, and the trained mask with its legend and counts."""

    async def open_samples(pilot):
        await settle(pilot)
        await pilot.press("2")
        await settle(pilot)

    assert snap_compare(FixedApp("agent job"), terminal_size=size, run_before=open_samples)


def test_new_job_with_an_example(snap_compare):
    async def load_example(pilot):
        await settle(pilot)
        pilot.app.screen.load(EXAMPLE)
        await settle(pilot)

    assert snap_compare(FixedApp("new job"), terminal_size=(120, 40), run_before=load_example)
