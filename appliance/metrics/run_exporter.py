"""Prometheus metrics of one run, fed from run_job's callbacks (the foreground `appliance train --metrics-addr`).

The daemon keeps its own TrainingMetrics for all jobs and feeds it the same
StepRecords and RunEvents; this exporter is the one-run version for a run
without a daemon. It reads plain data only (no trainer, no engines).
"""

from __future__ import annotations

from pathlib import Path

from appliance.grpo.step_record import RunEvent, StepRecord
from appliance.metrics.training_metrics import TrainingMetrics
from appliance.metrics.scrape_server import serve_metrics


def apply_event(metrics: TrainingMetrics, event: RunEvent, slot: str = "0") -> None:
    """What a RunEvent tells the metrics: the plan and device at the start, engine snapshots after a step."""
    if event.kind == "memory" and "planned_bytes" in event.data:
        metrics.observe_planned(event.data["planned_bytes"], event.data["budget_bytes"], slot)
        if event.data.get("device_total_bytes"):
            metrics.observe_device_bytes(event.data["device_total_bytes"], event.data.get("device_used_bytes"), slot)
    elif event.kind == "engine_metrics":
        metrics.add_engine_snapshot(event.data["snapshot"])


class RunExporter:
    """Serves one run's appliance_* metrics at http://host:port/metrics until `close()`."""

    def __init__(
        self, data_dir: Path, host: str, port: int, *, version: str, student_model: str, judge_model: str | None = None
    ):
        self.data_dir = Path(data_dir)
        self.metrics = TrainingMetrics(version=version, student_model=student_model, judge_model=judge_model)
        self.metrics.observe_disk(self.data_dir)
        self.server = serve_metrics(self.metrics, host, port)

    def on_step(self, record: StepRecord) -> None:
        self.metrics.observe_step(record)
        self.metrics.observe_disk(self.data_dir)

    def on_event(self, event: RunEvent) -> None:
        apply_event(self.metrics, event)

    def close(self) -> None:
        self.server.close()
