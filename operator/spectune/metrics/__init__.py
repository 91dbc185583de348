"""Metric sources behind one port, and the parsing and windowing they share.

``exposition`` parses pages, ``observation`` turns two moments into a window,
``scrape`` and ``prometheus`` are the two ways to fetch, ``source`` is the port.
"""

from spectune.metrics.exposition import Sample, Snapshot, parse_page
from spectune.metrics.observation import (
    Histogram,
    Observation,
    PodCounts,
    SpecCounts,
    observation_from_pages,
)
from spectune.metrics.prometheus import PrometheusSource, validate_selector
from spectune.metrics.scrape import PodScrapeSource
from spectune.metrics.source import MetricSource

__all__ = [
    "Histogram",
    "MetricSource",
    "Observation",
    "PodCounts",
    "PodScrapeSource",
    "PrometheusSource",
    "Sample",
    "Snapshot",
    "SpecCounts",
    "observation_from_pages",
    "parse_page",
    "validate_selector",
]
