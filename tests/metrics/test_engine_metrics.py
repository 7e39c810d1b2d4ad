"""vLLM engines' vllm:* metrics re-exported through the appliance registry, student and judge side by side."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from appliance.engines.vllm_metrics import capture_vllm_collectors, snapshot_collectors
from appliance.metrics import SnapshotError


def engine_snapshot(model_name: str, generated: int, running: int, latencies: list[float]) -> dict:
    """What VLLMEngine.metrics_snapshot() returns, built from vLLM-style collectors in their own registry."""
    registry = CollectorRegistry()
    labels = {"model_name": model_name, "engine": "0"}
    Counter("vllm:generation_tokens", "Number of generation tokens processed.", list(labels), registry=registry).labels(
        **labels
    ).inc(generated)
    Gauge(
        "vllm:num_requests_running", "Number of requests in model execution batches.", list(labels), registry=registry
    ).labels(**labels).set(running)
    latency = Histogram(
        "vllm:e2e_request_latency_seconds",
        "End to end request latency in seconds.",
        list(labels),
        buckets=(0.5, 1.0, 5.0),
        registry=registry,
    ).labels(**labels)
    for seconds in latencies:
        latency.observe(seconds)
    return {"model_name": model_name, "families": snapshot_collectors(capture_vllm_collectors(registry))}


def test_student_and_judge_engines_appear_as_one_family_each_told_apart_by_model_name(metrics, scrape):
    metrics.add_engine_snapshot(engine_snapshot("student", generated=800, running=2, latencies=[0.2, 3.0]))
    metrics.add_engine_snapshot(engine_snapshot("judge", generated=120, running=0, latencies=[0.7]))
    got = scrape()

    assert got.families["vllm:generation_tokens"].type == "counter"
    assert got.value("vllm:generation_tokens_total", model_name="student", engine="0") == 800
    assert got.value("vllm:generation_tokens_total", model_name="judge", engine="0") == 120
    assert got.value("vllm:num_requests_running", model_name="student", engine="0") == 2
    assert got.families["vllm:e2e_request_latency_seconds"].type == "histogram"
    assert got.value("vllm:e2e_request_latency_seconds_bucket", model_name="student", engine="0", le="0.5") == 1
    assert got.value("vllm:e2e_request_latency_seconds_bucket", model_name="student", engine="0", le="+Inf") == 2
    assert got.value("vllm:e2e_request_latency_seconds_sum", model_name="judge", engine="0") == 0.7
    assert got.text.count("# TYPE vllm:generation_tokens_total counter") == 1
    assert "job" not in got.all_label_names() and "step" not in got.all_label_names()


def test_a_later_snapshot_of_the_same_model_replaces_the_earlier(metrics, scrape):
    metrics.add_engine_snapshot(engine_snapshot("student", generated=800, running=2, latencies=[0.2]))
    metrics.add_engine_snapshot(engine_snapshot("judge", generated=120, running=1, latencies=[0.7]))
    metrics.add_engine_snapshot(engine_snapshot("student", generated=1500, running=0, latencies=[0.2, 0.3]))
    got = scrape()

    assert [
        s.value
        for s in got.families["vllm:generation_tokens"].samples
        if s.name.endswith("_total") and s.labels["model_name"] == "student"
    ] == [1500]
    assert got.value("vllm:num_requests_running", model_name="student", engine="0") == 0
    assert got.value("vllm:e2e_request_latency_seconds_count", model_name="student", engine="0") == 2
    assert got.value("vllm:generation_tokens_total", model_name="judge", engine="0") == 120
    assert metrics.engines.model_names() == ["judge", "student"]


def test_names_prometheus_would_reject_are_sanitised():
    from appliance.metrics.engines import label_name, metric_name

    assert metric_name("vllm:gpu-cache.usage") == "vllm:gpu_cache_usage"
    assert metric_name("9lives") == "_9lives"
    assert label_name("model-name") == "model_name"
    assert label_name("a:b") == "a_b"


def test_a_snapshot_without_model_name_or_families_is_refused_saying_what_is_expected(metrics):
    with pytest.raises(SnapshotError, match="needs 'model_name'"):
        metrics.add_engine_snapshot({"families": []})
    with pytest.raises(SnapshotError, match="family 'vllm:x' has no 'samples'"):
        metrics.add_engine_snapshot({"model_name": "student", "families": [{"name": "vllm:x", "type": "gauge"}]})
