"""Read one offline vLLM engine's `vllm:*` Prometheus metrics, as plain data.

vLLM 0.32 keeps an offline `LLM`'s metrics in the process-global
prometheus_client REGISTRY (with `disable_log_stats=False`), labelled
`model_name` (= served_model_name) and `engine`. `LLM.get_metrics()` reads that
registry, but every new `LLM` unregisters all `vllm:*` collectors first
(`unregister_vllm_metrics()`), so with a student and a judge engine in one
worker only the last one would be visible. The first engine's stat logger
keeps updating its own metric objects, though: so each engine captures the
collectors that were registered right after it started and reads those.

The snapshot is JSON-friendly (the worker sends it to the daemon, which
re-exports it; DESIGN.md: no prometheus_client multiprocess mode).
"""

from __future__ import annotations

from typing import Any

VLLM_METRIC_PREFIX = "vllm:"


def capture_vllm_collectors(registry: Any = None) -> list[Any]:
    """The `vllm:*` collectors registered now (call right after creating an `LLM`)."""
    if registry is None:
        from prometheus_client import REGISTRY as registry
    # prometheus_client has no public listing of collectors; vLLM itself walks this dict.
    return [
        collector
        for collector in list(registry._collector_to_names)
        if getattr(collector, "_name", "").startswith(VLLM_METRIC_PREFIX)
    ]


def snapshot_collectors(collectors: list[Any]) -> list[dict]:
    """Current values: one dict per metric family with its samples (names as exposed, e.g. `_total`)."""
    families: list[dict] = []
    for collector in collectors:
        for family in collector.collect():
            families.append(
                {
                    "name": family.name,
                    "type": family.type,
                    "documentation": family.documentation,
                    "samples": [
                        {"name": sample.name, "labels": dict(sample.labels), "value": float(sample.value)}
                        for sample in family.samples
                    ],
                }
            )
    return families


def sample_value(snapshot: list[dict], sample_name: str, **labels: str) -> float | None:
    """The value of one sample in a snapshot (None when absent), e.g. `vllm:generation_tokens_total`."""
    for family in snapshot:
        for sample in family["samples"]:
            if sample["name"] == sample_name and all(sample["labels"].get(k) == v for k, v in labels.items()):
                return sample["value"]
    return None
