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


def test_every_appliance_metric_an_alert_names_is_one_the_daemon_exposes():
    """alerts.test.yml feeds promtool series by name: a rule on a misspelt or renamed metric passes it and never
    fires on a box. Every appliance_* name in alerts.yml must be a sample the daemon's registry exposes."""
    import yaml
    from test_dashboard_file import METRIC_NAME, daemon_sample_names

    rules = yaml.safe_load((IMAGES / "alerts.yml").read_text())["groups"]
    named = {n for group in rules for rule in group["rules"] for n in METRIC_NAME.findall(rule["expr"])}
    named = {name for name in named if name.startswith("appliance_")}

    assert {"appliance_jobs", "appliance_worker_restarts_total", "appliance_last_step_timestamp_seconds"} <= named
    assert sorted(named - daemon_sample_names()) == []
