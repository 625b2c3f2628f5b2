"""Reading Prometheus text exposition in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total
