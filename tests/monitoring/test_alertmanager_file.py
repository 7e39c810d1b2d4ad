"""Alerts reach someone: prometheus.yml sends them to Alertmanager, and images/alertmanager.yml (checked by
Debian's amtool) routes every alert of alerts.yml to a receiver that notifies somebody."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from packaging_support import need_tool

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGES = REPO_ROOT / "images"
NOTIFIERS = ("email_configs", "webhook_configs", "slack_configs", "pagerduty_configs", "msteams_configs")


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([need_tool("amtool", "prometheus-alertmanager"), *args], capture_output=True, text=True)


def receiver_of(config: Path, labels: dict[str, str]) -> str:
    """The receiver Alertmanager's routing tree gives an alert with these labels (amtool's own routing)."""
    routed = amtool("config", "routes", "test", "--config.file", str(config), *(f"{k}={v}" for k, v in labels.items()))
    assert routed.returncode == 0, routed.stdout + routed.stderr
    return routed.stdout.strip()


def notifies(config: Path, receiver: str) -> bool:
    receivers = {entry["name"]: entry for entry in yaml.safe_load(config.read_text())["receivers"]}
    return any(receivers[receiver].get(kind) for kind in NOTIFIERS)


def test_prometheus_sends_alerts_to_the_local_alertmanager():
    config = yaml.safe_load((IMAGES / "prometheus.yml").read_text())
    targets = [
        target for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"] for target in sc["targets"]
    ]

    assert targets == ["127.0.0.1:9093"]  # Debian's prometheus-alertmanager, on the box's loopback


def test_the_example_alertmanager_config_is_valid():
    checked = amtool("check-config", str(IMAGES / "alertmanager.yml"))

    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_alert_is_routed_to_a_receiver_that_notifies():
    rules = yaml.safe_load((IMAGES / "alerts.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    config = IMAGES / "alertmanager.yml"

    assert len(alerts) >= 17
    for rule in alerts:
        labels = {"alertname": rule["alert"], "instance": "127.0.0.1:9464", **rule["labels"]}
        receiver = receiver_of(config, labels)
        assert notifies(config, receiver), f"{rule['alert']} goes to '{receiver}', which notifies nobody"
        # The always-firing Watchdog goes to the dead-man's switch alone; every other alert to people.
        if rule["alert"] == "Watchdog":
            assert (rule["labels"]["severity"], receiver) == ("none", "deadmans-switch")
        else:
            assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
            assert receiver != "deadmans-switch", rule["alert"]


def test_a_receiver_without_a_notifier_is_caught(tmp_path: Path):
    config = yaml.safe_load((IMAGES / "alertmanager.yml").read_text())
    config["receivers"].append({"name": "nobody"})
    config["route"]["routes"].insert(0, {"matchers": ['severity="warning"'], "receiver": "nobody"})
    silent = tmp_path / "alertmanager.yml"
    silent.write_text(yaml.safe_dump(config))

    assert amtool("check-config", str(silent)).returncode == 0  # valid for Alertmanager, yet useless
    assert receiver_of(silent, {"alertname": "ApplianceDiskLow", "severity": "warning"}) == "nobody"
    assert not notifies(silent, "nobody")


def test_amtool_refuses_a_route_to_an_undeclared_receiver(tmp_path: Path):
    config = yaml.safe_load((IMAGES / "alertmanager.yml").read_text())
    config["route"]["receiver"] = "on-call"
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config))

    checked = amtool("check-config", str(broken))

    assert checked.returncode != 0 and "on-call" in checked.stdout + checked.stderr
