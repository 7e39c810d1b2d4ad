"""Shared helpers: a metrics exporter on a free loopback port and a parsed scrape of it."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.metrics import TrainingMetrics, serve_metrics


@pytest.fixture
def metrics():
    return TrainingMetrics(version="0.1.0", student_model="smollm2-135m-instruct", judge_model="qwen2.5-7b-instruct")


@pytest.fixture
def server(metrics):
    handle = serve_metrics(metrics, "127.0.0.1", 0)
    yield handle
    handle.close()


class Scrape:
    """One GET of /metrics, parsed: families by name and sample values by (sample name, labels)."""

    def __init__(self, url: str) -> None:
        with urllib.request.urlopen(url, timeout=10) as response:
            self.content_type = response.headers["Content-Type"]
            self.text = response.read().decode()
        self.families = {family.name: family for family in text_string_to_metric_families(self.text)}

    def value(self, sample_name: str, **labels: str) -> float | None:
        for family in self.families.values():
            for sample in family.samples:
                if sample.name == sample_name and sample.labels == labels:
                    return sample.value
        return None

    def label_sets(self, family_name: str) -> list[dict]:
        return [sample.labels for sample in self.families[family_name].samples]

    def all_label_names(self) -> set[str]:
        return {name for family in self.families.values() for sample in family.samples for name in sample.labels}


@pytest.fixture
def scrape(server):
    return lambda: Scrape(server.url)
