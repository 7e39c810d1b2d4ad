"""Helpers for the packaging checks (systemd/, images/, monitoring files)."""

from __future__ import annotations

import os
import shutil

import pytest


def need_tool(name: str, package: str) -> str:
    """The path of a system program; skipped where it is absent, a failure in CI (.ci/run installs it)."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (Debian package {package}; .ci/run installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
