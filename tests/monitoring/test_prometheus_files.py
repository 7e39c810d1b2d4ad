"""images/prometheus.yml and images/alerts.yml: valid for Debian's promtool, and every alert fires on
the series that mean trouble and stays quiet otherwise (tests/monitoring/alerts.test.yml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from packaging_support import need_tool

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGES = REPO_ROOT / "images"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([need_tool("promtool", "prometheus"), *args], capture_output=True, text=True)


def test_scrape_config_is_valid_and_loads_the_alerts():
    result = promtool("check", "config", str(IMAGES / "prometheus.yml"))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_alert_rules_are_valid():
    result = promtool("check", "rules", str(IMAGES / "alerts.yml"))

    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_when_it_should():
    tests = Path(__file__).with_name("alerts.test.yml")
    alerts = {
        line.split(":", 1)[1].strip()
        for line in (IMAGES / "alerts.yml").read_text().splitlines()
        if line.strip().startswith("- alert:")
    }
    tested = {
        line.split(":", 1)[1].strip()
        for line in tests.read_text().splitlines()
        if line.strip().startswith("alertname:")
    }

    result = promtool("test", "rules", str(tests))

    assert result.returncode == 0, result.stdout + result.stderr
    assert alerts == tested, "every alert needs a case in alerts.test.yml"
