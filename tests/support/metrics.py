"""One real HTTP scrape of a daemon's Prometheus ``/metrics``."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict:
    """``{(sample name, sorted label pairs): value}`` of the metrics served at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }
