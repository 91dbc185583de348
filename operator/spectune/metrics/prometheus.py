"""Read a window of engine metrics from Prometheus.

Used by ``spectune diagnose --prometheus`` and by the operator (the default source). The
PromQL is built from the dialect's catalogue: counters only through ``increase()``,
gauges through ``avg_over_time()``, so a restarted pod (counter reset) or a scrape gap
never turns into a wrong number. Queries go to ``/api/v1/query`` over httpx's async client
(no worker threads, an explicit timeout, redirects never followed); answers are classified
by :func:`answer` (HTTP status and ``errorType``, never the body's words).

Why httpx and not prometheus-api-client (which spectune used before): spectune needs one
endpoint, ``/api/v1/query``, and needs to tell its answers apart. The client reports every
non-200 answer as one exception whose text holds the body, so a rejected query and a down
server could only be told apart by matching "400" in that text; it is synchronous
(requests), so each query took a worker thread to keep the operator's event loop free; it
follows redirects, which would carry the credentials to another address; and it pulls in
requests and dateparser (with regex, pytz and tzlocal) for features spectune never calls. httpx is
already the operator's HTTP client (the pod scrapes), is async, takes an ``ssl.SSLContext``
for a private CA, and raises typed errors (connect, timeout, protocol) that :func:`_reason`
turns into one line without the library's internals.

Connectivity for real deployments (a Thanos, Mimir or Cortex in front, TLS with a private
CA): extra headers such as ``X-Scope-OrgID`` go with every request, a CA bundle or
``insecure_skip_verify`` sets how the server's certificate is checked, and a ``cluster``
matcher is added to every query spectune builds, so a global view of many clusters never
mixes their pods.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import ssl
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import httpx

from spectune.engines import Catalogue, Dialect, PageIdentity, catalogue_for
from spectune.errors import (
    InputError,
    NoDataError,
    QueryRejectedError,
    SourceUnavailableError,
    UnauthorizedError,
)
from spectune.metrics.exposition import Sample, Snapshot
from spectune.metrics.observation import PROCESS_START, Observation, observation_from_pages
from spectune.selectors import check_headers, check_label_name, validate_selector

__all__ = ["PrometheusSource", "answer", "check_headers", "tls_context", "validate_selector"]


Result = list[dict[str, Any]]

#: Statuses a load balancer in front of Prometheus answers while it is passing (bad gateway,
#: unavailable, gateway timeout): asked again twice, 0.2 s then 0.4 s later. A 500 or a 4xx
#: is Prometheus' own answer, and the user should see it at once.
RETRY_STATUSES = frozenset({502, 503, 504})
RETRY_DELAYS = (0.2, 0.4)


def tls_context(ca_pem: str | None = None, insecure_skip_verify: bool = False) -> ssl.SSLContext:
    """How the server's certificate is checked: the system's CAs, or only ``ca_pem``'s
    (PEM text of one or more CA certificates), or not at all (``insecure_skip_verify``:
    the traffic is still encrypted, but anyone on the path can read it)."""
    if insecure_skip_verify:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if ca_pem is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError):
        raise InputError(
            "the CA bundle is not PEM certificates (-----BEGIN CERTIFICATE-----); give the "
            "CA that signed Prometheus' certificate"
        ) from None


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
        Extra HTTP headers (``Authorization`` from a Secret, ``X-Scope-OrgID``) for every
        request.
    quote_errors
        Add the API's own ``error`` text to messages (the CLI, whose user reads their own
        terminal).
    tls
        How the server's certificate is checked (:func:`tls_context`); the system's CAs
        when omitted.
    cluster
        ``(label, value)``: a matcher added to every query, for a Prometheus (Thanos, Mimir)
        that holds many clusters' series.
    """

    def __init__(
        self,
        url: str,
        selector: str,
        dialect: Dialect | None = None,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        quote_errors: bool = False,
        tls: ssl.SSLContext | None = None,
        cluster: tuple[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise InputError(f"Prometheus URL {url!r} must start with http:// or https://")
        body = validate_selector(selector)
        if cluster is not None:
            label, value = cluster
            check_label_name(label, "the cluster label")
            matcher = f"{label}={json.dumps(value)}"
            body = f"{body},{matcher}" if body else matcher
        self._body = body
        self._url = url.rstrip("/")
        self._dialect = dialect
        # How the series are spelled in this Prometheus (a router that rewrote ':' to '_',
        # Dynamo's 'trtllm:'); None for the engine's own names.
        self._naming: str | None = None
        self._timeout = timeout_s
        self._quote = quote_errors
        self._headers = dict(headers or {})
        self._tls = tls if tls is not None else ssl.create_default_context()
        self._transport = transport

    @property
    def selector_body(self) -> str:
        """The label matchers every query carries, without braces (the cluster's included)."""
        return self._body

    # -- querying -----------------------------------------------------------------------

    async def _get(self, client: httpx.AsyncClient, params: Mapping[str, str]) -> httpx.Response:
        for delay in (*RETRY_DELAYS, None):
            resp = await client.get(f"{self._url}/api/v1/query", params=params)
            if resp.status_code not in RETRY_STATUSES or delay is None:
                return resp
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def query(self, promql: str, at: float | None = None) -> Result:
        """Run one instant query, within the source's timeout.

        A redirect is refused, not followed: the credentials were given for this URL, not
        for wherever it points.
        """
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            async with httpx.AsyncClient(
                headers=self._headers,
                timeout=self._timeout,
                verify=self._tls,
                follow_redirects=False,
                transport=self._transport,
                trust_env=False,
            ) as client:
                resp = await asyncio.wait_for(
                    self._get(client, params), timeout=self._timeout * 3 + 1.0
                )
        except (TimeoutError, httpx.TimeoutException):
            raise SourceUnavailableError(
                f"Prometheus at {self._url} did not answer within {self._timeout:g}s"
            ) from None
        except httpx.HTTPError as exc:
            raise SourceUnavailableError(
                f"cannot reach Prometheus at {self._url}: {_reason(exc)}"
            ) from None
        if resp.status_code in RETRY_STATUSES:
            raise SourceUnavailableError(
                f"Prometheus at {self._url} kept answering HTTP {resp.status_code} (a proxy in "
                "front of it says it is not there)"
            )
        return answer(resp.status_code, resp.content, self._url, quote=self._quote)

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
                    v0 = await self.query(
                        f"count({self._sel('vllm:num_requests_swapped')}) or "
                        f"count({self._sel('vllm:spec_decode_draft_acceptance_rate')})",
                        at,
                    )
                    return Dialect.VLLM_V0 if v0 else Dialect.VLLM_V1
                return cat.dialect
        for naming, spelled, dialect in (
            ("sglang_", "sglang_num_running_reqs", Dialect.SGLANG),
            ("trtllm:", "trtllm:num_requests_running", Dialect.TRTLLM),
        ):
            if await self.query(f"count({self._sel(spelled)})", at):
                self._naming = naming
                return dialect
        raise NoDataError(
            f"the selector {{{self._body}}} matches no serving-engine series in Prometheus at "
            f"{self._url}; check the labels with: count by (__name__)({{{self._body}}})"
        )

    async def observe(self, window_s: float, at: float | None = None) -> Observation:
        """Return the observation for the ``window_s`` seconds that end at ``at`` (now).

        One range query fetches every raw sample of the dialect's series for the selected
        pods over the window; increases are computed here with Prometheus' counter-reset
        rule (a drop is a restart) and stretched to the window's length as ``increase()``
        does, gauges are averaged over the window, and the result goes through the same
        window arithmetic as two saved pages
        (:func:`~spectune.metrics.observation_from_pages`). One query per group and window
        keeps an operator with hundreds of SpecTunings within its query budget.
        """
        if window_s <= 0:
            raise InputError(f"the window must be positive, got {window_s:g}s")
        if self._dialect is None:
            self._dialect = await self.detect_dialect(at)  # once: the pods keep their engine
        dialect = self._dialect
        cat = catalogue_for(dialect)
        ident = PageIdentity(dialect, "", self._naming)
        spelled = {_spell(n, self._naming): n for n in _series_names(cat)}
        regex = "|".join(re.escape(n) for n in sorted(spelled))
        rows = await self.query(f'{{__name__=~"{regex}",{self._body}}}[{round(window_s)}s]', at)
        for row in rows:
            metric = row.get("metric")
            if isinstance(metric, dict) and "__name__" in metric:
                metric["__name__"] = ident.canonical(str(metric["__name__"]))
        if not rows:
            raise NoDataError(
                f"the selector {{{self._body}}} matches no {dialect.value} series at {self._url}"
            )
        before, after, covered, resets = _pages_from_ranges(rows, dialect, window_s, cat)
        if not after:
            raise NoDataError(f"the selector {{{self._body}}} matches no pod at {self._url}")
        obs = observation_from_pages(before, after, window_s)
        return replace(obs, covered=covered, resets=resets)

    async def is_online(self) -> bool:
        """Whether Prometheus answers a trivial query."""
        try:
            await self.query("vector(1)")
        except SourceUnavailableError:
            return False
        return True


def _series_names(cat: Catalogue) -> list[str]:
    """Every sample name the dialect's observation reads (histograms as their three parts)."""
    plain = [
        cat.drafts, cat.draft_tokens, cat.accepted_tokens, cat.accepted_per_pos,
        cat.drafted_per_pos, cat.emitted_tokens, cat.acceptance_rate_gauge,
        cat.accept_length_gauge, cat.efficiency_gauge, cat.running, cat.waiting, cat.kv_usage,
        cat.cache_config_info, cat.kv_capacity_tokens_gauge, cat.preemptions,
        cat.generation_tokens, cat.prompt_tokens, cat.kv_usage_fallback, cat.verify_calls,
        cat.spec_steps_gauge, cat.spec_draft_tokens_gauge, cat.spec_config_info,
        cat.kv_max_blocks, cat.kv_tokens_per_block,
    ]  # fmt: skip
    names = [n for n in plain if n]
    names.append(PROCESS_START)  # each pod's start: its uptime, for per-pod decay
    names += [h + part for h in _histograms(cat) for part in ("_bucket", "_sum", "_count")]
    return sorted(set(names))


def _spell(name: str, naming: str | None) -> str:
    """A catalogue name as a Prometheus with this spelling stores it."""
    if naming == "sglang_" and name.startswith("sglang:"):
        return "sglang_" + name[len("sglang:") :]
    if naming == "trtllm:" and name.startswith("trtllm_"):
        return "trtllm:" + name[len("trtllm_") :]
    return name


def _histograms(cat: Catalogue) -> list[str]:
    named = (cat.tpot_hist, cat.ttft_hist, cat.queue_hist, cat.e2e_hist,
             cat.request_acceptance_hist, *(name for name, _ in cat.tpot_fallbacks))  # fmt: skip
    return [h for h in named if h]


#: Labels Prometheus adds to every series; not part of the engine's own label sets.
_TARGET_LABELS = ("job", "instance", "pod", "namespace")


def _pages_from_ranges(
    rows: Result, dialect: Dialect, window_s: float, cat: Catalogue
) -> tuple[list[Snapshot], list[Snapshot], float | None, tuple[str, ...]]:
    """Per-pod start and end snapshots equivalent to the window's raw samples, the share of
    the window the least-seen pod's counters span (``Observation.covered``; None without a
    counter), and the pods whose counters went back within it (a restart:
    ``Observation.resets``).

    The start page holds each cumulative series' first sample; the end page holds it plus
    the reset-aware increase over the samples, stretched to the whole window (samples
    cover a little less than it). Gauges read their mean over the window on both pages.
    """
    cumulative = {
        n
        for n in (cat.drafts, cat.draft_tokens, cat.accepted_tokens, cat.accepted_per_pos,
                  cat.drafted_per_pos, cat.emitted_tokens, cat.preemptions,
                  cat.generation_tokens, cat.prompt_tokens, cat.verify_calls)
        if n
    }  # fmt: skip
    cumulative |= {h + part for h in _histograms(cat) for part in ("_bucket", "_sum", "_count")}
    start: dict[str, dict[str, list[Sample]]] = {}
    end: dict[str, dict[str, list[Sample]]] = {}
    spans: dict[str, float] = {}
    resets: set[str] = set()
    for row in rows:
        metric = dict(row.get("metric", {}))
        name = str(metric.pop("__name__", ""))
        points = _points(row)
        if not name or not points:
            continue
        pod = _pod_name({"metric": metric})
        labels = tuple(sorted((k, str(v)) for k, v in metric.items() if k not in _TARGET_LABELS))
        if name in cumulative:
            bad = next((v for _, v in points if not math.isfinite(v)), None)
            if bad is not None:
                raise InputError(
                    f"pod {pod}: counter {name} has the value {bad:g} in Prometheus; a counter "
                    "counts events and is never NaN or infinite, so the engine's page is "
                    "corrupt and the window cannot be read"
                )
            first = points[0][1]
            span = points[-1][0] - points[0][0]
            spans[pod] = max(spans.get(pod, 0.0), span)
            stretch = min(window_s / span, 2.0) if span > 0 else 1.0
            values = [v for _, v in points]
            if any(b < a for a, b in itertools.pairwise(values)):
                resets.add(pod)
            last = first + _increase(values) * stretch
        else:
            points = [(t, v) for t, v in points if not math.isnan(v)]
            if not points:
                continue
            first = last = math.fsum(v for _, v in points) / len(points)
        start.setdefault(pod, {}).setdefault(name, []).append(Sample(name, labels, first))
        end.setdefault(pod, {}).setdefault(name, []).append(Sample(name, labels, last))

    def snapshots(pages: dict[str, dict[str, list[Sample]]]) -> list[Snapshot]:
        return [
            Snapshot(pod, dialect, {k: tuple(v) for k, v in series.items()}, {})
            for pod, series in sorted(pages.items())
        ]

    covered = min((min(span / window_s, 1.0) for span in spans.values()), default=None)
    return snapshots(start), snapshots(end), covered, tuple(sorted(resets))


def _points(row: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The (time, value) samples of one range-query series (NaNs kept: a gauge's mean
    drops them, a counter refuses them)."""
    try:
        points = [(float(t), float(v)) for t, v in row["values"]]
    except (KeyError, TypeError, ValueError):
        raise SourceUnavailableError(
            "Prometheus answered a range series without numeric samples"
        ) from None
    return points


def _increase(values: list[float]) -> float:
    """Growth of a counter over samples; a drop is a restart from zero (Prometheus' rule)."""
    return math.fsum(cur - prev if cur >= prev else cur for prev, cur in itertools.pairwise(values))


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


#: ``errorType`` values of the Prometheus HTTP API (``web/api/v1/api.go``); only these are
#: ever repeated in a message, as they are a closed set and carry nothing of the body.
ERROR_TYPES = frozenset(
    {"timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found",
     "not_acceptable"}
)  # fmt: skip


def answer(status: int, body: bytes, url: str, quote: bool = False) -> Result:
    """The result rows of one ``/api/v1/query`` answer, or the error it is.

    Errors are told apart by the HTTP status and the API's ``errorType``, never by words in
    the body: 401/403 is :class:`~spectune.errors.UnauthorizedError`; 400 ``bad_data`` is
    :class:`~spectune.errors.QueryRejectedError`; everything else that is not a success
    (5xx, 429, ``timeout``, ``execution``, ``canceled``, ``internal``, ``unavailable``, a
    redirect, a 404, a body that is not the API's JSON) is
    :class:`~spectune.errors.SourceUnavailableError`. All three are temporary.

    No message repeats the body, beyond a known ``errorType``: the URL may be any address
    the operator can reach, and the message lands in a status that whoever may read the
    SpecTuning reads. With ``quote`` (the CLI, whose user chose the URL and reads their own
    terminal) the API's ``error`` text is added, on one line.

    >>> answer(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}', "u")
    []
    >>> try:
    ...     answer(503, b'{"status":"error","errorType":"unavailable","error":"x"}', "http://p")
    ... except SourceUnavailableError as exc:
    ...     print(exc)
    Prometheus at http://p answered an error (HTTP 503, unavailable)
    """
    payload = _json(body)
    kind = payload.get("errorType") if isinstance(payload, dict) else None
    kind = kind if isinstance(kind, str) and kind in ERROR_TYPES else None
    said = ""
    if quote and isinstance(payload, dict) and isinstance(payload.get("error"), str):
        said = f": {_one_line(payload['error'])}"
    what = f"HTTP {status}" + (f", {kind}" if kind else "")
    if status == 200 and isinstance(payload, dict) and payload.get("status") == "success":
        data = payload.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if isinstance(result, list) and all(isinstance(r, dict) for r in result):
            return result
        raise SourceUnavailableError(
            f"Prometheus at {url} answered an unexpected shape for an instant query"
        )
    if status in (401, 403):
        raise UnauthorizedError(
            f"Prometheus at {url} refused the credentials ({what}); check the Secret of "
            "spec.metrics.prometheus.authSecretRef (or the operator's access to Prometheus)"
            f"{said}"
        )
    if status == 400 and kind == "bad_data":
        raise QueryRejectedError(
            f"Prometheus at {url} rejected a query spectune built ({what}); check that "
            "the regular expressions of spec.metrics.prometheus.selector are valid RE2; if "
            "they are, this Prometheus does not accept spectune's query (an incompatible "
            f"version, or a bug to report){said}"
        )
    if 300 <= status < 400:
        raise SourceUnavailableError(
            f"Prometheus at {url} answered a redirect ({what}); give the final address of "
            "Prometheus' HTTP API (credentials are never sent on to another URL)"
        )
    if 200 <= status < 300:
        raise SourceUnavailableError(
            f"Prometheus at {url} answered something that is not its JSON API ({what}); is "
            "it the base URL of Prometheus' HTTP API?"
        )
    raise SourceUnavailableError(f"Prometheus at {url} answered an error ({what}){said}")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _one_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return "".join(ch if ch.isprintable() else "?" for ch in line[:200])


def _reason(exc: httpx.HTTPError) -> str:
    """Why a request failed, in words and on one line, without the library's internals
    (object reprs, connection pools, the query string)."""
    text = _one_line(str(exc))
    if "CERTIFICATE_VERIFY_FAILED" in text or isinstance(
        exc.__context__, ssl.SSLCertVerificationError
    ):
        return (
            "its TLS certificate is not trusted; give the CA that signed it (--ca-file, "
            "spec.metrics.prometheus.tls.caSecretRef), or skip the check (insecureSkipVerify)"
        )
    if "SSL" in text or "TLS" in text:
        return "the TLS handshake failed (is it https, on this port?)"
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", text)
    text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", text)
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({text.lower()})" if text else "cannot connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the server closed the connection or answered something that is not HTTP"
    return text or type(exc).__name__
