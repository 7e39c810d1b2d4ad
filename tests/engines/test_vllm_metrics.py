"""Per-engine vllm:* metrics survive a second engine unregistering them (vLLM 0.32 behaviour)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from appliance.engines.vllm_metrics import capture_vllm_collectors, sample_value, snapshot_collectors


def unregister_vllm_collectors(registry):
    """What vllm.v1.metrics.prometheus.unregister_vllm_metrics() does to the global registry."""
    for collector in list(registry._collector_to_names):
        if getattr(collector, "_name", "").startswith("vllm:"):
            registry.unregister(collector)


def start_engine_metrics(registry, model_name: str):
    unregister_vllm_collectors(registry)
    counter = Counter("vllm:generation_tokens", "Generated tokens.", ["model_name", "engine"], registry=registry)
    return counter.labels(model_name=model_name, engine="0")


def test_each_engine_reads_its_own_counters_after_another_engine_started():
    registry = CollectorRegistry()
    Counter("appliance_other", "Not vLLM's.", registry=registry)
    student = start_engine_metrics(registry, "student")
    student_collectors = capture_vllm_collectors(registry)
    judge = start_engine_metrics(registry, "judge")
    judge_collectors = capture_vllm_collectors(registry)

    student.inc(7)
    judge.inc(3)

    student_snapshot = snapshot_collectors(student_collectors)
    judge_snapshot = snapshot_collectors(judge_collectors)
    assert sample_value(student_snapshot, "vllm:generation_tokens_total", model_name="student") == 7.0
    assert sample_value(judge_snapshot, "vllm:generation_tokens_total", model_name="judge") == 3.0
    assert sample_value(student_snapshot, "vllm:generation_tokens_total", model_name="judge") is None
    assert [family["name"] for family in student_snapshot] == ["vllm:generation_tokens"]
    assert student_snapshot[0]["type"] == "counter"
