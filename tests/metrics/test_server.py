"""The exporter: bound where asked, Prometheus text format, gone after close(); --metrics-addr parsing."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from appliance.errors import UsageError
from appliance.metrics import parse_metrics_addr, serve_metrics


def test_port_0_binds_a_free_loopback_port_that_serves_prometheus_text(metrics, server, scrape):
    assert server.host == "127.0.0.1" and server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"
    got = scrape()
    assert got.content_type.startswith("text/plain; version=0.0.4")
    assert got.value("appliance_train_steps_total") == 0


def test_close_stops_serving_and_frees_the_port(metrics):
    handle = serve_metrics(metrics, "127.0.0.1", 0)
    port = handle.port
    handle.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    again = serve_metrics(metrics, "127.0.0.1", port)  # the port can be bound again
    again.close()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:9100", ("0.0.0.0", 9100)),
        (":9464", ("127.0.0.1", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_metrics_addr_is_host_and_port(text, expected):
    assert parse_metrics_addr(text) == expected


@pytest.mark.parametrize("text", ["9464", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000", ""])
def test_a_bad_metrics_addr_names_the_flag_and_an_example(text):
    with pytest.raises(UsageError, match="--metrics-addr .* is not HOST:PORT .* for example 127.0.0.1:9464"):
        parse_metrics_addr(text)
