"""Serve a TrainingMetrics registry over HTTP for Prometheus to scrape (`--metrics-addr HOST:PORT`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from appliance.errors import UsageError
from appliance.metrics.training_metrics import TrainingMetrics

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464


@dataclass
class MetricsServer:
    """A running exporter; `port` is the bound one (useful when asked for port 0)."""

    host: str
    port: int
    _httpd: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


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
    """Start serving `metrics` at http://host:port/metrics on a daemon thread; `.close()` stops it."""
    httpd, thread = start_http_server(port, addr=host, registry=metrics.registry)
    return MetricsServer(host, httpd.server_port, httpd, thread)
