"""Route changes from a traffic-mix query (``spec.retune.trafficMix``).

The controller re-opens the search when the routes fingerprint of the Deployment it sees
changes (``Deployment.routes``, kept in ``ControllerState.routes``). This module makes that
fingerprint from a PromQL query: each series of the result is a route, its share of the
total is its share of the mix, and the fingerprint is the mix itself (readable JSON, so
``status.observedRoutes`` shows what the search ran on). :class:`RouteWatch` keeps reporting
the mix the search ran on until the current one moves away from it by more than the
threshold (total variation distance); then it reports the new mix, which re-opens the search
and becomes the new reference. A query that fails or returns nothing changes nothing: a
Prometheus outage is not a route change.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from spectune.errors import InputError, NoDataError, SourceUnavailableError

__all__ = ["RouteWatch", "decode_mix", "encode_mix", "mix_distance", "mix_of"]

log = logging.getLogger(__name__)

Rows = list[dict[str, Any]]
Query = Callable[[str], Awaitable[Rows]]
_MAX_LEN = 1000
"""Longest fingerprint (``status.observedRoutes`` holds 1024 characters)."""
_OTHER = "(other)"


def _route(metric: Mapping[str, Any]) -> str:
    labels = sorted((str(k), str(v)) for k, v in metric.items() if k != "__name__")
    return ",".join(f"{k}={v}" for k, v in labels) or "{}"


def mix_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each route's share of the total traffic from an instant query's result.

    Empty when the result is empty or sums to nothing (NaN and negative values are
    dropped).

    >>> mix_of([{"metric": {"route": "chat"}, "value": [0, "3"]},
    ...         {"metric": {"route": "code"}, "value": [0, "1"]}])
    {'route=chat': 0.75, 'route=code': 0.25}
    """
    values: dict[str, float] = {}
    for row in rows:
        try:
            v = float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(v) and v > 0:
            key = _route(row.get("metric") or {})
            values[key] = values.get(key, 0.0) + v
    total = math.fsum(values.values())
    if total <= 0:
        return {}
    return {k: v / total for k, v in sorted(values.items())}


def mix_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Total variation distance: half the sum of the absolute share changes (0..1).

    >>> mix_distance({"chat": 0.8, "code": 0.2}, {"chat": 0.5, "code": 0.5})
    0.3
    >>> mix_distance({"chat": 1.0}, {"code": 1.0})
    1.0
    """
    keys = set(a) | set(b)
    return round(math.fsum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys) / 2, 12)


def encode_mix(mix: Mapping[str, float]) -> str:
    """The fingerprint of a mix: compact JSON, shares to three decimals.

    Beyond :data:`_MAX_LEN` characters the smallest routes are summed as ``(other)``.

    >>> encode_mix({"route=chat": 0.75, "route=code": 0.25})
    '{"route=chat":0.75,"route=code":0.25}'
    """
    items = sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))
    keep = len(items)
    while True:
        head = dict(items[:keep])
        rest = math.fsum(v for _, v in items[keep:])
        if rest > 0:
            head[_OTHER] = head.get(_OTHER, 0.0) + rest
        text = json.dumps({k: round(v, 3) for k, v in sorted(head.items())}, separators=(",", ":"))
        if len(text) <= _MAX_LEN or keep <= 1:
            return text
        keep -= 1


def decode_mix(text: str | None) -> dict[str, float] | None:
    """The mix a fingerprint holds, or None for one that is not a mix (empty, a hash)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    try:
        return {str(k): float(v) for k, v in doc.items()}
    except (TypeError, ValueError):
        return None


class RouteWatch:
    """Turns the traffic-mix query into the routes fingerprint (see the module docstring).

    Parameters
    ----------
    query
        Runs an instant PromQL query (the SpecTuning's Prometheus source).
    promql
        ``spec.retune.trafficMix.query``.
    threshold
        ``spec.retune.trafficMix.threshold``: the total variation distance that counts as
        a route change.
    on_change
        Called with ``(distance, old, new)`` when the mix moved beyond the threshold (the
        tuning loop posts an Event).
    """

    def __init__(
        self,
        query: Query,
        promql: str,
        threshold: float,
        on_change: Callable[[float, Mapping[str, float], Mapping[str, float]], None],
    ) -> None:
        self._query = query
        self._promql = promql
        self._threshold = threshold
        self._on_change = on_change
        self.last_error: str | None = None

    async def measure(self) -> dict[str, float]:
        """The current mix; empty when the query fails or returns no traffic."""
        try:
            rows = await self._query(self._promql)
        except (SourceUnavailableError, NoDataError, InputError) as exc:
            self.last_error = str(exc)
            log.info("traffic-mix query failed; routes unchanged: %s", exc)
            return {}
        self.last_error = None
        return mix_of(rows)

    async def routes(self, reference: str | None) -> str:
        """The routes fingerprint to report: ``reference`` unless the mix moved away from it.

        With no reference (a new search), the current mix becomes it.
        """
        mix = await self.measure()
        if not mix:
            return reference or ""
        old = decode_mix(reference)
        if old is None:
            return encode_mix(mix)
        d = mix_distance(old, _folded(mix, old))
        if d <= self._threshold:
            return reference or ""
        self._on_change(d, old, mix)
        return encode_mix(mix)


def _folded(mix: Mapping[str, float], like: Mapping[str, float]) -> dict[str, float]:
    """``mix`` with the routes ``like`` lumped into ``(other)`` lumped there too."""
    if _OTHER not in like:
        return dict(mix)
    out: dict[str, float] = {}
    for k, v in mix.items():
        key = k if k in like else _OTHER
        out[key] = out.get(key, 0.0) + v
    return out


def describe_move(old: Mapping[str, float], new: Mapping[str, float], top: int = 3) -> str:
    """The routes whose share moved most, e.g. ``route=chat 0.80→0.40, route=code 0.20→0.60``."""
    keys = sorted(set(old) | set(new), key=lambda k: -abs(new.get(k, 0.0) - old.get(k, 0.0)))
    return ", ".join(f"{k} {old.get(k, 0.0):.2f}→{new.get(k, 0.0):.2f}" for k in keys[:top])
