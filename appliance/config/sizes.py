"""Memory sizes as people write them ("70GiB", "90%", 12e9) and as code keeps them (bytes).

Base units in code; GiB only on screen (DESIGN.md habit 3).
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")


def parse_bytes(text: str | int | float) -> int:
    """'70GiB' -> 75161927680. Raises ValueError naming the accepted forms."""
    if isinstance(text, bool):
        raise ValueError("expected a size such as 70GiB, 512MiB or a number of bytes")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError("a size cannot be negative")
        return int(text)
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"'{text}' is not a size: write e.g. 70GiB, 512MiB, 8GB or a number of bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_memory_budget(value: str | int, device_total_bytes: int) -> int:
    """A budget as bytes: '90%' of the device, or an absolute size."""
    if isinstance(value, str):
        percent = _PERCENT.match(value)
        if percent:
            fraction = float(percent.group(1)) / 100.0
            if not 0.0 < fraction <= 1.0:
                raise ValueError(f"'{value}' must be a percentage above 0% and at most 100%")
            return int(device_total_bytes * fraction)
    size = parse_bytes(value)
    if size <= 0:
        raise ValueError("the memory budget must be above zero")
    return size


def format_bytes(size: int | float) -> str:
    """For people: "1.50 GiB", "300.00 MiB", "12 B"."""
    size = float(size)
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{int(size)} B"
