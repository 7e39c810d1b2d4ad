"""Plain-text formatting shared by the widgets and screens: bytes, durations, ages, bars, trends.

Base units come in (bytes, seconds, epoch seconds); GiB and minutes appear
only here, on screen (DESIGN.md habit 3). Every function is pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

GIB = 2**30
SPARK_CHARS = "▁▂▃▄▅▆▇█"
BAR_FULL = "█"
BAR_EMPTY = "░"
MISSING = "–"


def gib(value: int | float | None, digits: int = 1) -> str:
    """Bytes as GiB for people ("3.2 GiB"); a dash when unknown."""
    if value is None:
        return MISSING
    return f"{value / GIB:.{digits}f} GiB"


def used_of(used: int | None, total: int | None) -> str:
    """ "3.2/20.0 GiB" (a dash for an unknown side)."""
    if used is None and total is None:
        return MISSING
    left = MISSING if used is None else f"{used / GIB:.1f}"
    right = MISSING if total is None else f"{total / GIB:.1f}"
    return f"{left}/{right} GiB"


def duration(seconds: float | None) -> str:
    """Seconds as a short human duration: "42s", "3m05s", "2h07m", "3d04h"."""
    if seconds is None or not math.isfinite(seconds):
        return MISSING
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def age(since: float | None, now: float) -> str:
    """How long ago an epoch time was, as a duration."""
    return MISSING if since is None else duration(now - since)


def number(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    return f"{value:.{digits}f}"


def rate(value: float | None) -> str:
    """Tokens per second, no decimals past 100."""
    if value is None:
        return MISSING
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def percent(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.0f}%"


def progress_bar(done: int, total: int, width: int) -> str:
    """A bar of `width` cells, filled in proportion to done/total."""
    if width <= 0:
        return ""
    fraction = 0.0 if total <= 0 else min(1.0, max(0.0, done / total))
    filled = int(round(fraction * width))
    return BAR_FULL * filled + BAR_EMPTY * (width - filled)


def sparkline(values: Sequence[float], width: int) -> str:
    """The last `width` values as block characters scaled between their min and max."""
    recent = [value for value in values if math.isfinite(value)][-width:]
    if not recent:
        return ""
    low, high = min(recent), max(recent)
    if high == low:
        return SPARK_CHARS[len(SPARK_CHARS) // 2 - 1] * len(recent)
    top = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[int(round((value - low) / (high - low) * top))] for value in recent)


def eta(steps_done: int, steps_total: int, seconds_per_step: float | None) -> float | None:
    """Seconds left at the recent pace; None before the first step."""
    if seconds_per_step is None or steps_done <= 0:
        return None
    return max(0, steps_total - steps_done) * seconds_per_step
