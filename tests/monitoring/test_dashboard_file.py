"""images/grafana-dashboard.json as Grafana imports it: a datasource variable, built-in panels only,
and the views the operators asked for (the live queries: tests/service/test_dashboard.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = json.loads((Path(__file__).resolve().parents[2] / "images" / "grafana-dashboard.json").read_text())
BUILT_IN_PANELS = {"timeseries", "stat", "bargauge", "gauge", "table", "text", "row"}


def exprs() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel.get("targets", [])]


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
