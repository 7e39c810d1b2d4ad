"""Prometheus metrics of the appliance: the appliance_* registry, engine re-export, and the HTTP exporter."""

from appliance.metrics.engines import EngineSnapshotCollector, SnapshotError
from appliance.metrics.training_metrics import TrainingMetrics
from appliance.metrics.scrape_server import MetricsServer, parse_metrics_addr, serve_metrics

__all__ = [
    "EngineSnapshotCollector",
    "MetricsServer",
    "SnapshotError",
    "TrainingMetrics",
    "parse_metrics_addr",
    "serve_metrics",
]
