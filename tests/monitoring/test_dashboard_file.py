"""images/grafana-dashboard.json as Grafana imports it: a datasource variable, built-in panels only,
the views the operators asked for, queries that parse (promtool) and name only metrics that exist: the
daemon's own (its registry) and vLLM's (its installed source). The live queries: tests/service/test_dashboard.py."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from appliance.metrics.training_metrics import TrainingMetrics
from packaging_support import need_tool

DASHBOARD = json.loads((Path(__file__).resolve().parents[2] / "images" / "grafana-dashboard.json").read_text())
BUILT_IN_PANELS = {"timeseries", "stat", "bargauge", "gauge", "table", "text", "row"}
METRIC_NAME = re.compile(r"\b(appliance_[a-z0-9_]+|vllm:[a-z0-9_:]+)\b")
# Grafana fills these in before a query reaches Prometheus.
GRAFANA_MACROS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# Registered by the daemon's supervisor on the same registry (appliance/service/supervisor.py).
SUPERVISOR_COUNTERS = {"appliance_worker_restarts"}
SAMPLE_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


def exprs() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel.get("targets", [])]


def panel(title_start: str) -> dict:
    found = [panel for panel in DASHBOARD["panels"] if panel["title"].startswith(title_start)]
    assert len(found) == 1, f"one panel titled '{title_start}...', found {[p['title'] for p in found]}"
    return found[0]


def daemon_sample_names() -> set[str]:
    """Every sample name the daemon's registry can expose (a counter `x` is scraped as `x_total`)."""
    metrics = TrainingMetrics(CollectorRegistry(), version="0", student_model="s")
    families = [(family.name, family.type) for family in metrics.registry.collect()]
    families += [(name, "counter") for name in SUPERVISOR_COUNTERS]
    names = set()
    for name, kind in families:
        suffixes = SAMPLE_SUFFIXES.get(kind, ("",))
        names |= {name + suffix for suffix in suffixes}
    return names


def test_the_datasource_is_a_template_variable_every_query_uses():
    variables = {var["name"]: var for var in DASHBOARD["templating"]["list"]}
    references = [panel["datasource"] for panel in DASHBOARD["panels"]] + [
        target["datasource"] for panel in DASHBOARD["panels"] for target in panel["targets"]
    ]

    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert all(ref == {"type": "prometheus", "uid": "${datasource}"} for ref in references)


def test_only_built_in_panels_and_no_plugin_requirements():
    assert {panel["type"] for panel in DASHBOARD["panels"]} <= BUILT_IN_PANELS
    assert "__requires" not in DASHBOARD and "__inputs" not in DASHBOARD


def test_panels_do_not_overlap_and_ids_are_unique():
    cells = set()
    for panel in DASHBOARD["panels"]:
        box = panel["gridPos"]
        mine = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        assert box["x"] + box["w"] <= 24
        cells |= mine
    assert len({panel["id"] for panel in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])


def test_the_requested_views_are_there():
    text = "\n".join(exprs())

    assert re.search(r"sum by \(role\) \(rate\(appliance_generated_tokens_total", text)
    assert (
        "histogram_quantile(0.5, sum by (le, phase)" in text and "histogram_quantile(0.95, sum by (le, phase)" in text
    )
    for metric in (
        "appliance_reward_mean",
        "appliance_reward_std",
        "appliance_eval_accuracy",
        "appliance_kl",
        "appliance_memory_used_bytes",
        "appliance_memory_budget_bytes",
        "DCGM_FI_DEV_FB_USED",
        "appliance_judge_requests_total",
        "appliance_jobs",
    ):
        assert metric in text, metric
    memory = next(
        panel for panel in DASHBOARD["panels"] if "appliance_memory_used_bytes" in panel["targets"][0]["expr"]
    )
    assert memory["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert memory["fieldConfig"]["defaults"]["unit"] == "bytes"
    # DCGM reports MiB; the panel is in bytes.
    assert any("DCGM_FI_DEV_FB_USED) * 1024 * 1024" in target["expr"] for target in memory["targets"])
    # The budget is a line over the stack, not a layer of it.
    budget = next(o for o in memory["fieldConfig"]["overrides"] if o["matcher"]["options"] == "budget")
    assert {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}} in budget["properties"]


def test_step_time_kv_cache_build_info_and_the_100_percent_line():
    step = panel("Seconds per step")
    kv = panel("vLLM KV cache usage")
    build = panel("Running version and models")
    plan = panel("Planned vs used memory")

    step_exprs = [target["expr"] for target in step["targets"]]
    assert any(expr.startswith("1 / (sum(rate(appliance_train_steps_total") for expr in step_exprs)
    assert any("appliance_step_duration_seconds_sum" in expr for expr in step_exprs)
    assert step["fieldConfig"]["defaults"]["unit"] == "s"
    assert "vllm:kv_cache_usage_perc" in kv["targets"][0]["expr"] and kv["fieldConfig"]["defaults"]["max"] == 1
    assert "appliance_build_info" in build["targets"][0]["expr"] and build["options"]["textMode"] == "name"
    for label in ("version", "student_model", "judge_model"):
        assert "{{" + label + "}}" in build["targets"][0]["legendFormat"]
    defaults = plan["fieldConfig"]["defaults"]
    assert plan["type"] == "timeseries" and defaults["unit"] == "percentunit"
    assert defaults["custom"]["thresholdsStyle"] == {"mode": "line"}
    assert {"color": "red", "value": 1} in defaults["thresholds"]["steps"]  # the line at 100% of the plan


def test_every_appliance_metric_a_panel_names_is_one_the_daemon_exposes():
    named = {name for expr in exprs() for name in METRIC_NAME.findall(expr) if name.startswith("appliance_")}
    exposed = daemon_sample_names()

    assert {"appliance_build_info", "appliance_train_steps_total", "appliance_step_duration_seconds_sum"} <= named
    assert sorted(named - exposed) == []


def test_a_misspelt_metric_would_be_caught():
    assert "appliance_train_steps" not in daemon_sample_names()  # scraped as _total only
    assert "appliance_worker_restarts_total" in daemon_sample_names()


def test_every_vllm_metric_a_panel_names_is_in_the_installed_vllm():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed (the cpu and gpu extras bring it)")
    source = "\n".join(
        path.read_text(errors="replace")
        for folder in spec.submodule_search_locations
        for path in (Path(folder) / "v1" / "metrics").glob("*.py")
    )
    named = {name for expr in exprs() for name in METRIC_NAME.findall(expr) if name.startswith("vllm:")}

    assert named, "the dashboard names no vLLM metric"
    assert sorted(name for name in named if f'"{name}"' not in source) == []


def test_every_panel_query_parses(tmp_path: Path):
    """promtool parses each query (Grafana's macros filled in) as a recording rule: no server needed."""
    rules = []
    for number, expr in enumerate(exprs()):
        for macro, value in GRAFANA_MACROS.items():
            expr = expr.replace(macro, value)
        rules.append({"record": f"dashboard:query_{number}", "expr": expr})
    rule_file = tmp_path / "dashboard-queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))

    checked = subprocess.run(
        [need_tool("promtool", "prometheus"), "check", "rules", str(rule_file)], capture_output=True, text=True
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout
