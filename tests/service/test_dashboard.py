"""images/grafana-dashboard.json and images/alerts.yml against a live Prometheus scraping a real
daemon that ran a job with a judge and a held-out evaluation.

Every panel query must parse and return at least one series, and every metric the dashboard or the
alerts name must be in the daemon's scrape. DCGM_* series come from NVIDIA's dcgm-exporter, which
only a GPU box runs: their queries must parse here, and return data on the box.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from daemon_support import Daemon, daemon_env, free_port, link_model_store, run_prometheus, short_tmp_dir

pytestmark = pytest.mark.model

IMAGES = Path(__file__).resolve().parents[2] / "images"
DASHBOARD = json.loads((IMAGES / "grafana-dashboard.json").read_text())
METRIC = re.compile(r"\b(appliance_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b")
# Grafana fills these in before a query reaches Prometheus; the scrape interval here is 1 s.
GRAFANA_MACROS = {"$__rate_interval": "30s", "$__interval": "5s", "$__range": "5m"}

JOB = """\
name: dashboard
student:
  model: smollm2-135m-instruct
  quantization: none
  lora: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}
judge:
  model: smollm2-135m-instruct
  quantization: none
  mode: pointwise
  max_new_tokens: 8
  rubric: Score 1 when the response gives the correct product, else 0.
task:
  dataset: builtin:multiply
  operand_min: 2
  operand_max: 5
  held_out: 1
rewards:
  - {name: correctness, weight: 1.0}
  - {name: judge, weight: 0.5}
grpo:
  group_size: 2
  prompts_per_step: 1
  max_new_tokens: 8
  steps: 2
checkpoint:
  every: 1
  keep_last: 1
  eval_every: 1
  eval_limit: 1
"""


def panel_queries() -> list[tuple[str, str]]:
    queries = []
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for macro, value in GRAFANA_MACROS.items():
                expr = expr.replace(macro, value)
            queries.append((f"{panel['title']} [{target['refId']}]", expr))
    return queries


def alert_queries() -> list[tuple[str, str]]:
    import yaml

    rules = yaml.safe_load((IMAGES / "alerts.yml").read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def query(base: str, expr: str, during: tuple[float, float]) -> dict:
    """A range query over the job's run, one point a second: a finished job's gauges are removed when its
    worker ends, so a panel must show data while the job ran, not after."""
    start, end = during
    url = f"{base}/api/v1/query_range?" + urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:  # 400: the expression does not parse
        return json.loads(error.read())


@pytest.fixture(scope="module")
def live(tmp_path_factory, store_data_dir):
    """A daemon that ran the job above to the end while a real Prometheus scraped it every second;
    yields (prometheus base URL, every appliance_* sample name Prometheus scraped, (submitted, ended) times)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    folder = short_tmp_dir()
    daemon = Daemon(
        link_model_store(store_data_dir, tmp / "data"),
        folder / "control.sock",
        free_port(),
        tmp / "daemon.log",
        ["--stop-timeout", "60"],
        daemon_env(),
    )
    try:
        daemon.start()
        with run_prometheus([f"127.0.0.1:{daemon.metrics_port}"]) as prometheus:
            job_file = tmp / "dashboard.yaml"
            job_file.write_text(JOB)
            submitted_at = time.time()
            submitted = daemon.cli("submit", str(job_file), "--json")
            assert submitted.returncode == 0, submitted.stderr
            job_id = json.loads(submitted.stdout)["job"]["id"]
            job_log = daemon.data_dir / "jobs" / job_id / "log.txt"
            try:
                job = daemon.wait_state(job_id, ("succeeded", "failed"), timeout=1200)
            finally:
                print(daemon.log()[-3000:], job_log.read_text()[-3000:] if job_log.exists() else "no log.txt")
            assert job.state == "succeeded", job_log.read_text()[-3000:]
            time.sleep(5)  # a few more scrapes: rates need two samples in their window
            # The job's own gauges are removed when its worker ends (just before job.updated): the names
            # are those Prometheus ever scraped, and queries cover the run from submit to end.
            with urllib.request.urlopen(f"{prometheus}/api/v1/label/__name__/values", timeout=10) as response:
                names = set(json.loads(response.read())["data"])
            yield prometheus, names, (submitted_at, job.updated)
    finally:
        daemon.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("name, expr", panel_queries(), ids=[name for name, _ in panel_queries()])
def test_every_panel_query_parses_and_returns_series(live, name: str, expr: str):
    prometheus, _, during = live

    body = query(prometheus, expr, during)

    assert body["status"] == "success", f"{name}: {body.get('error')}"
    if all(metric.startswith("DCGM_") for metric in METRIC.findall(expr)):
        return  # dcgm-exporter only: parsed; it has data on a GPU box
    assert len(body["data"]["result"]) >= 1, f"{name}: {expr} returned no series"


@pytest.mark.parametrize("name, expr", alert_queries(), ids=[name for name, _ in alert_queries()])
def test_every_alert_expression_parses_against_the_live_server(live, name: str, expr: str):
    prometheus, _, during = live

    body = query(prometheus, expr, during)

    assert body["status"] == "success", f"{name}: {body.get('error')}"


def test_no_metric_in_the_dashboard_or_the_alerts_is_missing_from_the_scrape(live):
    _, scraped, _ = live
    named = {metric for _, expr in panel_queries() + alert_queries() for metric in METRIC.findall(expr)}

    missing = sorted(metric for metric in named if metric.startswith("appliance_") and metric not in scraped)

    assert missing == []
    assert {"appliance_judge_requests_total", "appliance_eval_accuracy", "appliance_memory_used_bytes"} <= named
