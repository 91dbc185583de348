"""Read a window of engine metrics from Prometheus.

Used by ``spectune diagnose --prometheus`` and by the operator (the default source). The
PromQL is built from the dialect's catalogue: counters only through ``increase()``,
gauges through ``avg_over_time()``, so a restarted pod (counter reset) or a scrape gap
never turns into a wrong number. prometheus-api-client is synchronous; each query runs in
a worker thread with an explicit timeout so the operator's event loop never blocks.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests import RequestException
from requests.exceptions import RetryError
from urllib3.util.retry import Retry

from spectune.engines import Catalogue, Dialect, catalogue_for
from spectune.errors import InputError, NoDataError, SourceUnavailableError
from spectune.metrics.observation import Histogram, Observation, SpecCounts

__all__ = ["PrometheusSource", "validate_selector"]

_MATCHER = re.compile(r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')

Result = list[dict[str, Any]]


def validate_selector(selector: str) -> str:
    """Check a label selector such as ``{namespace="x",pod=~"llama-.*"}``; return its body.

    Raises :class:`~spectune.errors.InputError` naming the problem.
    """
    text = selector.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise InputError(
            f"selector {selector!r} must be label matchers in braces, e.g. "
            '\'{namespace="llm",pod=~"llama-.*"}\''
        )
    body = text[1:-1].strip()
    if not body:
        raise InputError('the selector is empty; name at least one label, e.g. {namespace="llm"}')
    parts = _split_matchers(body)
    for part in parts:
        if not _MATCHER.fullmatch(part):
            raise InputError(f'selector matcher {part.strip()!r} is not of the form label="value"')
    return body


def _split_matchers(body: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    in_quotes = escaped = False
    for ch in body:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif ch == "," and not in_quotes:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current))
    return parts


class PrometheusSource:
    """A :class:`~spectune.metrics.source.MetricSource` backed by a Prometheus server.

    Parameters
    ----------
    url
        Base URL of the Prometheus HTTP API, e.g. ``http://prometheus.monitoring:9090``.
    selector
        Label matchers in braces that pick the serving pods.
    dialect
        The engine's metric dialect; detected from the series names when omitted.
    timeout_s
        Timeout of each query, in seconds.
    headers
        Extra HTTP headers (e.g. ``Authorization``) for every request.
    """

    def __init__(
        self,
        url: str,
        selector: str,
        dialect: Dialect | None = None,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise InputError(f"Prometheus URL {url!r} must start with http:// or https://")
        self._body = validate_selector(selector)
        self._url = url.rstrip("/")
        self._dialect = dialect
        self._timeout = timeout_s
        # Retry only what a load balancer in front of Prometheus says is passing (502–504);
        # a 500 or 4xx is an answer, and the user should see it at once.
        retry = Retry(total=2, backoff_factor=0.2, status_forcelist=(502, 503, 504))
        self._client = PrometheusConnect(
            url=self._url,
            headers=dict(headers or {}),
            disable_ssl=False,
            timeout=max(1, round(timeout_s)),
            retry=retry,
        )

    # -- querying -----------------------------------------------------------------------

    def _query_sync(self, promql: str, at: float | None) -> Result:
        params = {"time": f"{at:.3f}"} if at is not None else None
        try:
            result = self._client.custom_query(promql, params=params)
        except PrometheusApiClientException as exc:
            text = str(exc)
            if "bad_data" in text or "400" in text:
                raise InputError(
                    f"Prometheus rejected the query {promql!r}: {_short(text)}; check --selector"
                ) from None
            raise SourceUnavailableError(
                f"Prometheus at {self._url} answered an error: {_short(text)}"
            ) from None
        except (
            ValueError
        ) as exc:  # a body that is not JSON (before RequestException: requests' JSON error is both)
            raise SourceUnavailableError(
                f"Prometheus at {self._url} answered something that is not its JSON API "
                f"({_short(str(exc))})"
            ) from None
        except RetryError as exc:
            raise SourceUnavailableError(
                f"Prometheus at {self._url} kept answering errors: {_short(str(exc))}"
            ) from None
        except RequestException as exc:
            raise SourceUnavailableError(
                f"cannot reach Prometheus at {self._url}: {_short(str(exc))}"
            ) from None
        if not isinstance(result, list) or not all(isinstance(r, dict) for r in result):
            raise SourceUnavailableError(
                f"Prometheus at {self._url} answered an unexpected shape for an instant query"
            )
        return result

    async def query(self, promql: str, at: float | None = None) -> Result:
        """Run one instant query in a worker thread, with the source's timeout."""
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._query_sync, promql, at), timeout=self._timeout + 1.0
            )
        except TimeoutError:
            raise SourceUnavailableError(
                f"Prometheus at {self._url} did not answer within {self._timeout:g}s"
            ) from None

    def _sel(self, name: str) -> str:
        return f"{name}{{{self._body}}}"

    async def _scalar(self, promql: str, at: float | None) -> float | None:
        rows = await self.query(promql, at)
        if not rows:
            return None
        value = _value(rows[0])
        return None if math.isnan(value) else value

    async def detect_dialect(self, at: float | None = None) -> Dialect:
        """Find which engine's series the selector matches."""
        for cat in (catalogue_for(d) for d in (Dialect.VLLM_V1, Dialect.SGLANG, Dialect.TRTLLM)):
            rows = await self.query(f"count({self._sel(cat.running)})", at)
            if rows:
                if cat.dialect is Dialect.VLLM_V1:
                    v1 = await self.query(f"count({self._sel('vllm:kv_cache_usage_perc')})", at)
                    return Dialect.VLLM_V1 if v1 else Dialect.VLLM_V0
                return cat.dialect
        raise NoDataError(
            f"the selector {{{self._body}}} matches no serving-engine series in Prometheus at "
            f"{self._url}; check the labels with: count by (__name__)({{{self._body}}})"
        )

    async def observe(self, window_s: float, at: float | None = None) -> Observation:
        """Return the observation for the ``window_s`` seconds that end at ``at`` (now)."""
        if window_s <= 0:
            raise InputError(f"the window must be positive, got {window_s:g}s")
        dialect = self._dialect or await self.detect_dialect(at)
        cat = catalogue_for(dialect)
        w = f"[{round(window_s)}s]"

        async def inc(name: str | None) -> float | None:
            if name is None:
                return None
            return await self._scalar(f"sum(increase({self._sel(name)}{w}))", at)

        async def gauge(name: str | None, agg: str = "avg") -> float | None:
            if name is None:
                return None
            return await self._scalar(f"{agg}(avg_over_time({self._sel(name)}{w}))", at)

        pods_rows = await self.query(f"count by (pod, instance)({self._sel(cat.running)})", at)
        if not pods_rows:
            raise NoDataError(
                f"the selector {{{self._body}}} matches no {cat.running} series at {self._url}"
            )
        pods = tuple(sorted({_pod_name(r) for r in pods_rows}))
        drafts, draft_tokens, accepted, emitted = await asyncio.gather(
            inc(cat.drafts),
            inc(cat.draft_tokens),
            inc(cat.accepted_tokens),
            inc(cat.emitted_tokens),
        )
        per_pos = await self._per_position(cat, w, at)
        if cat.drafts is None and cat.drafted_per_pos is not None:
            first = await self._per_position(cat, w, at, name=cat.drafted_per_pos)
            drafts = first[0] if first else None
        spec = None
        if any(v is not None for v in (drafts, draft_tokens, accepted)):
            spec = SpecCounts(drafts, draft_tokens, accepted, per_pos, emitted)
        (gen, prompt, preempt, running, waiting, kv, rate_g, len_g, eff_g) = await asyncio.gather(
            inc(cat.generation_tokens),
            inc(cat.prompt_tokens),
            inc(cat.preemptions),
            gauge(cat.running),
            gauge(cat.waiting, "sum"),
            gauge(cat.kv_usage),
            gauge(cat.acceptance_rate_gauge),
            gauge(cat.accept_length_gauge),
            gauge(cat.efficiency_gauge),
        )
        if dialect is Dialect.SGLANG and len_g is not None and len_g <= 0:
            len_g = rate_g = None
        tpot, ttft, queue, e2e = await asyncio.gather(
            self._histogram(cat.tpot_hist, w, at),
            self._histogram(cat.ttft_hist, w, at),
            self._histogram(cat.queue_hist, w, at),
            self._histogram(cat.e2e_hist, w, at),
        )
        blocks, size, tokens = await self._cache(cat, at)
        resets = await self._resets(cat, w, at)
        return Observation(
            dialect=dialect,
            window_s=window_s,
            pods=pods,
            spec=spec,
            acceptance_rate_gauge=rate_g,
            accept_length_gauge=len_g,
            efficiency_gauge=eff_g,
            generation_tokens=gen,
            prompt_tokens=prompt,
            preemptions=preempt,
            running=running,
            waiting=waiting,
            kv_usage=kv,
            num_gpu_blocks=blocks,
            block_size=size,
            kv_capacity_tokens=tokens,
            tpot=tpot,
            ttft=ttft,
            queue=queue,
            e2e=e2e,
            resets=resets,
        )

    async def _per_position(
        self, cat: Catalogue, w: str, at: float | None, name: str | None = None
    ) -> tuple[float, ...] | None:
        name = name or cat.accepted_per_pos
        label = cat.position_label
        if name is None or label is None:
            return None
        rows = await self.query(f"sum by ({label})(increase({self._sel(name)}{w}))", at)
        if not rows:
            return None
        by_pos: dict[int, float] = {}
        for r in rows:
            raw = r.get("metric", {}).get(label)
            value = _value(r)
            if raw is None or math.isnan(value):
                continue
            by_pos[int(raw)] = value
        if not by_pos:
            return None
        return tuple(by_pos.get(i, 0.0) for i in range(max(by_pos) + 1))

    async def _histogram(self, name: str | None, w: str, at: float | None) -> Histogram | None:
        if name is None:
            return None
        rows, total, count = await asyncio.gather(
            self.query(f"sum by (le)(increase({self._sel(name + '_bucket')}{w}))", at),
            self._scalar(f"sum(increase({self._sel(name + '_sum')}{w}))", at),
            self._scalar(f"sum(increase({self._sel(name + '_count')}{w}))", at),
        )
        buckets: dict[float, float] = {}
        for r in rows:
            le = r.get("metric", {}).get("le")
            value = _value(r)
            if le is None or math.isnan(value):
                continue
            buckets[float(le)] = value
        if not buckets or count is None:
            return None
        bounds = tuple(sorted(buckets))
        return Histogram(bounds, tuple(buckets[b] for b in bounds), total or 0.0, count)

    async def _cache(
        self, cat: Catalogue, at: float | None
    ) -> tuple[int | None, int | None, int | None]:
        blocks = size = tokens = None
        if cat.cache_config_info is not None:
            for r in await self.query(self._sel(cat.cache_config_info), at):
                labels = r.get("metric", {})
                blocks = _min_label(labels, "num_gpu_blocks", blocks)
                size = _min_label(labels, "block_size", size)
                tokens = _min_label(labels, "kv_cache_size_tokens", tokens)
        if tokens is None and cat.kv_capacity_tokens_gauge is not None:
            g = await self._scalar(f"min({self._sel(cat.kv_capacity_tokens_gauge)})", at)
            tokens = int(g) if g is not None else None
        if tokens is None and blocks is not None and size is not None:
            tokens = blocks * size
        return blocks, size, tokens

    async def _resets(self, cat: Catalogue, w: str, at: float | None) -> tuple[str, ...]:
        name = cat.drafts or cat.generation_tokens
        if name is None:
            return ()
        rows = await self.query(f"resets({self._sel(name)}{w}) > 0", at)
        return tuple(sorted({_pod_name(r) for r in rows}))

    async def is_online(self) -> bool:
        """Whether Prometheus answers a trivial query."""
        try:
            await self.query("vector(1)")
        except (SourceUnavailableError, InputError):
            return False
        return True


def _value(row: Mapping[str, Any]) -> float:
    try:
        return float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise SourceUnavailableError(
            "Prometheus answered a sample without a numeric value"
        ) from None


def _pod_name(row: Mapping[str, Any]) -> str:
    labels = row.get("metric", {})
    return str(labels.get("pod") or labels.get("instance") or "unknown")


def _min_label(labels: Mapping[str, str], key: str, current: int | None) -> int | None:
    raw = labels.get(key)
    try:
        value = int(float(raw)) if raw not in (None, "", "None") else None
    except ValueError:
        value = None
    if value is None:
        return current
    return value if current is None else min(current, value)


def _short(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:200]
