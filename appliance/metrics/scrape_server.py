"""Serve a TrainingMetrics registry over HTTP for Prometheus to scrape (`--metrics-addr HOST:PORT`).

The port is reachable by any local account, so it is served like every other
listener (appliance/http_listener.py): one thread running an event loop, no
thread per connection, connections capped per peer and in total, request
heads and idle connections timed out.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import make_asgi_app

from appliance.errors import UsageError
from appliance.http_listener import ListenerLimits, RunningServer, serve_guarded
from appliance.metrics.training_metrics import TrainingMetrics

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464
# Prometheus keeps one connection per target; a few more for people with curl.
METRICS_LIMITS = ListenerLimits(total=128, per_peer=32)


@dataclass
class MetricsServer:
    """A running exporter; `port` is the bound one (useful when asked for port 0)."""

    host: str
    port: int
    _running: RunningServer

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._running.close(timeout_seconds=10)


def parse_metrics_addr(text: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or '[::1]:PORT' -> (host, port); a clear error for anything else."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(
            f"--metrics-addr '{text}' is not HOST:PORT with a port 0-65535; for example {DEFAULT_HOST}:{DEFAULT_PORT}"
        )
    host = host.strip("[]") or DEFAULT_HOST
    return host, int(port_text)


def serve_metrics(metrics: TrainingMetrics, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> MetricsServer:
    """Start serving `metrics` at http://host:port/metrics on one thread; `.close()` stops it."""
    running = serve_guarded(make_asgi_app(registry=metrics.registry), host, port, METRICS_LIMITS, name="metrics")
    return MetricsServer(host, int(running.url.rsplit(":", 1)[1]), running)
