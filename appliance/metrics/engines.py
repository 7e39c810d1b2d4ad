"""Re-export the `vllm:*` metrics of the generation engines through our registry.

Each vLLM engine hands the daemon a JSON-friendly snapshot of its metrics
(appliance.engines.vllm_metrics, `VLLMEngine.metrics_snapshot()`):

    {"model_name": "...", "families": [{"name", "type", "documentation",
                                        "samples": [{"name", "labels", "value"}]}]}

`EngineSnapshotCollector` keeps the newest snapshot per model_name and yields
them as Prometheus families on every scrape. The student's and the judge's
samples of the same family are merged into one family and told apart by their
`model_name` label (one family name may appear only once in an exposition).
"""

from __future__ import annotations

import re
import threading
from typing import Iterator

from prometheus_client.metrics_core import METRIC_TYPES, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from appliance.errors import ApplianceError

_BAD_METRIC_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_:]")
_BAD_LABEL_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(name: str) -> str:
    """A valid Prometheus metric name (':' is allowed, as vLLM's `vllm:` prefix needs)."""
    name = _BAD_METRIC_NAME_CHARS.sub("_", name)
    return "_" + name if not name or name[0].isdigit() else name


def label_name(name: str) -> str:
    name = _BAD_LABEL_NAME_CHARS.sub("_", name)
    return "_" + name if not name or name[0].isdigit() else name


class SnapshotError(ApplianceError):
    """An engine snapshot is not in the shape `metrics_snapshot()` produces."""


class EngineSnapshotCollector(Collector):
    """Yields the newest engine snapshot of each model_name as Prometheus metric families."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, list[dict]] = {}

    def add(self, snapshot: dict) -> None:
        """Keep `snapshot`, replacing the earlier one of the same model_name."""
        model_name = snapshot.get("model_name") if isinstance(snapshot, dict) else None
        if not model_name or not isinstance(snapshot.get("families"), list):
            raise SnapshotError(
                "an engine metrics snapshot needs 'model_name' (non-empty) and a 'families' list, "
                "as VLLMEngine.metrics_snapshot() returns"
            )
        for family in snapshot["families"]:
            missing = [key for key in ("name", "type", "samples") if key not in family]
            if missing:
                raise SnapshotError(
                    f"engine snapshot of '{model_name}': family {family.get('name', '?')!r} "
                    f"has no {', '.join(repr(k) for k in missing)}"
                )
        with self._lock:
            self._snapshots[model_name] = snapshot["families"]

    def model_names(self) -> list[str]:
        with self._lock:
            return sorted(self._snapshots)

    def describe(self) -> list[Metric]:
        # The families are known only at scrape time; an empty description skips the registry's name check.
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshots = dict(self._snapshots)
        merged: dict[str, Metric] = {}
        for model_name, families in sorted(snapshots.items()):
            for family in families:
                kind = "unknown" if family["type"] not in METRIC_TYPES else family["type"]
                name = metric_name(family["name"])
                if kind == "counter" and name.endswith("_total"):
                    name = name[: -len("_total")]  # the family is named without it; its samples carry it
                metric = merged.get(name)
                if metric is None:
                    metric = merged[name] = Metric(name, family.get("documentation", ""), kind)
                for sample in family["samples"]:
                    labels = {label_name(k): str(v) for k, v in sample.get("labels", {}).items()}
                    labels["model_name"] = model_name
                    # The snapshot holds exposition samples already (_total, _bucket, _created): copy them as they are.
                    metric.samples.append(Sample(metric_name(sample["name"]), labels, float(sample["value"])))
        yield from merged.values()
