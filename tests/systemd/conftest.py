"""System tools the packaging checks run (systemd, promtool): skipped where absent, required in CI."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def system_tool():
    def need(name: str, package: str) -> str:
        path = shutil.which(name)
        if path:
            return path
        message = f"{name} is not installed (Debian package {package}; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)

    return need
