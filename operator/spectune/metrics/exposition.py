"""Parse one ``/metrics`` page into a typed snapshot.

Every reader of engine metrics goes through here: ``spectune diagnose`` on saved pages,
the pod scraper, and the simulator's pages in the bench. Parsing is delegated to
prometheus_client's own text parser, so a page Prometheus accepts is a page we accept,
and a malformed page is rejected with the parser's reason instead of a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from spectune.engines import Dialect, PageIdentity, identify_page
from spectune.errors import InputError

__all__ = ["Labels", "Sample", "Snapshot", "parse_page"]

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    """One sample of a page: its full sample name, sorted labels and value."""

    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str | None:
        """Return the value of label ``key``, or ``None`` when the sample lacks it."""
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass(frozen=True)
class Snapshot:
    """A parsed page of one pod at one moment.

    ``samples`` is keyed by the full sample name as it appears on the page (counters keep
    their ``_total``; histograms appear as ``_bucket``/``_sum``/``_count``).
    """

    pod: str
    dialect: Dialect
    samples: Mapping[str, tuple[Sample, ...]] = field(repr=False)
    family_types: Mapping[str, str] = field(repr=False)
    identity: PageIdentity | None = None
    """The engine, version range and spelling :func:`parse_page` found (None for pages
    assembled from Prometheus answers, whose names are already the catalogue's)."""

    def series(self, name: str | None) -> tuple[Sample, ...]:
        """All samples called ``name`` (empty when absent or when ``name`` is None)."""
        if name is None:
            return ()
        return self.samples.get(name, ())

    def has(self, name: str | None) -> bool:
        """Whether the page holds at least one sample called ``name``."""
        return bool(self.series(name))

    def total(self, name: str | None) -> float | None:
        """Sum of every sample called ``name`` over all label sets; ``None`` when absent."""
        found = self.series(name)
        if not found:
            return None
        return math.fsum(s.value for s in found)


def parse_page(text: str, pod: str = "pod-0") -> Snapshot:
    """Parse exposition text into a :class:`Snapshot` and detect its dialect.

    Raises :class:`~spectune.errors.InputError` with a one-line reason when the text is not
    valid exposition format, is empty, or comes from a program that is not a serving
    engine spectune knows.
    """
    if not text.strip():
        raise InputError(f"{pod}: the metrics page is empty; is this the engine's /metrics URL?")
    samples: dict[str, list[Sample]] = {}
    types: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for s in family.samples:
                labels = tuple(sorted((str(k), str(v)) for k, v in s.labels.items()))
                samples.setdefault(s.name, []).append(Sample(s.name, labels, float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"{pod}: not a valid Prometheus exposition page ({reason[:160]}); "
            "check that the file is the raw text of a /metrics endpoint"
        ) from None
    if not samples:
        raise InputError(f"{pod}: the page holds no samples; is this the engine's /metrics URL?")
    label_names = {k for found in samples.values() for s in found for k, _ in s.labels}
    identity = identify_page(_family_names(types, samples), label_names)
    if identity.naming is not None:
        # A router or pipeline spelled the names its own way: read them as the engine's.
        renamed: dict[str, list[Sample]] = {}
        for name, found in samples.items():
            new = identity.canonical(name)
            renamed.setdefault(new, []).extend(Sample(new, s.labels, s.value) for s in found)
        samples = renamed
        types = {identity.canonical(k): v for k, v in types.items()}
    frozen = {k: tuple(v) for k, v in samples.items()}
    return Snapshot(
        pod=pod, dialect=identity.dialect, samples=frozen, family_types=types, identity=identity
    )


def _family_names(types: Mapping[str, str], samples: Iterable[str]) -> set[str]:
    return set(types) | set(samples)
